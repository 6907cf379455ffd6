"""Topics: the pipeline's one declaration, the Avro codec, and the Kafka plumbing every stage shares."""
