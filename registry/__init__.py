"""A schema registry with the Confluent-compatible REST API, kept in a replicated, compacted Kafka topic.

Why our own: the Kafka ecosystem's registries are not installable here (Confluent's is not on Maven Central;
Apicurio Registry's application modules are only partly there and its Quarkus app must be built first;
Karapace is not on PyPI). The subset every Kafka client uses is small (register, look up, fetch by id,
compatibility, config), Avro compatibility is the `avro` package's checker, and storage is the same Kafka the
pipeline trusts (docs/decisions/0011-replicated-data-plane.md).
"""
