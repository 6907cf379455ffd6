"""Adapters for the two stores: Cassandra (conversations) and ClickHouse (usage)."""
