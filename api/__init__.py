"""The edge: HTTP + SSE in front of the pipeline. Stateless; any number of replicas, one reply partition each."""
