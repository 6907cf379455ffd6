"""Bringing the stack up: the local launcher (no Docker) and the deployment descriptions."""
