"""The schema registry's rules and the wire format: ids from content, compatibility enforced, each record
naming its writer's schema, old records decoded through the writer's schema, unknown ids refused as poison."""

import io
import json
import struct

import fastavro
import pytest

from registry.store import Incompatible, InProcess, Store, canonical
from topics import codec
from topics.errors import PoisonEvent, RetriableError

from .test_schemas import RELEASED, raw, sample


def released_record(name: str) -> dict:
    named: dict = {}
    for dep in ("Usage", "ChatMessage", "PromptAccepted"):
        sample(raw(RELEASED, dep), named)
    return sample(raw(RELEASED, name), named)


@pytest.mark.parametrize("name", sorted(p.stem for p in RELEASED.glob("*.avsc")))
def test_a_record_written_with_each_released_schema_decodes_with_todays_through_its_id(name, schema_registry):
    writer = codec.expanded(name, RELEASED)
    schema_id = schema_registry.registry.register(f"released-test.{name}", writer)
    record = released_record(name)
    buf = io.BytesIO()
    buf.write(struct.pack(">bI", 0, schema_id))
    fastavro.schemaless_writer(buf, fastavro.parse_schema(json.loads(writer)), record)
    decoded = codec.decode(name, buf.getvalue())
    for field in raw(RELEASED, name)["fields"]:  # every released field reads back; fields added since take defaults
        value = decoded[field["name"]]  # a timestamp-millis reads back as the epoch-ms int it was written as
        if not isinstance(record[field["name"]], dict):
            assert as_written(value, record[field["name"]]) == record[field["name"]], field["name"]
    added = {f["name"] for f in raw(codec.SCHEMA_DIR, name)["fields"]} - set(record)
    assert added <= set(decoded)


def as_written(value, written):
    """The decoded value with only the fields the writer wrote: a nested record read through today's schema
    has the fields added since, with their defaults."""
    if isinstance(written, list) and isinstance(value, list):
        return [as_written(v, w) for v, w in zip(value, written)] + value[len(written) :]
    if isinstance(written, dict) and isinstance(value, dict):
        return {k: as_written(value[k], w) for k, w in written.items() if k in value}
    return value


def test_every_record_names_its_writer_schema_and_the_id_follows_the_content():
    record = released_record("PromptAccepted")
    payload = codec.encode("PromptAccepted", record)
    assert payload[0] == 0
    schema_id = codec.writer_id(payload)
    other = InProcess()  # another registry replica, or tomorrow's: the same schema gets the same id
    assert other.register(codec.subject("PromptAccepted"), codec.expanded("PromptAccepted")) == schema_id
    assert json.loads(other.fetch(schema_id))["name"] == "PromptAccepted"
    assert codec.subject("PromptAccepted") == "parley.events.PromptAccepted"


def test_the_expanded_schema_stands_alone():
    import avro.schema

    for name in codec.schemas():
        avro.schema.parse(codec.expanded(name))  # every named type it uses is defined in it


def test_registration_enforces_backward_compatibility():
    store = InProcess()
    base = json.loads(codec.expanded("RunCompleted"))
    first = store.register("s", json.dumps(base))
    assert store.register("s", json.dumps(base)) == first  # the same schema again: the same id, no new version
    optional = {**base, "fields": [*base["fields"], {"name": "extra", "type": ["null", "string"], "default": None}]}
    second = store.register("s", json.dumps(optional))
    assert second != first and store.store.versions["s"] == [first, second]
    required = {**base, "fields": [*base["fields"], {"name": "needed", "type": "string"}]}
    with pytest.raises(Incompatible, match="needed"):
        store.register("s", json.dumps(required))
    store.store.levels["s"] = "NONE"
    assert store.register("s", json.dumps(required)) not in (first, second)


def test_colliding_ids_take_the_next_free_one():
    store = Store()
    text = canonical('{"type": "string"}')
    taken = store.new_id(text)
    store.by_id[taken] = canonical('{"type": "int"}')
    assert store.new_id(text) == taken % 0x7FFF_FFFF + 1


def test_unknown_ids_and_foreign_bytes_are_poison_with_the_reason():
    body = codec.encode("PromptAccepted", released_record("PromptAccepted"))[5:]
    with pytest.raises(PoisonEvent, match="unknown schema id 2147483000"):
        codec.decode("PromptAccepted", struct.pack(">bI", 0, 2_147_483_000) + body)
    with pytest.raises(PoisonEvent, match="wire format"):
        codec.decode("PromptAccepted", b"\x01\x00\x00\x00\x01" + body)


class Away(InProcess):
    """A registry that answers registrations, then goes away: every fetch fails as an unreachable one does."""

    def fetch(self, schema_id: int) -> str | None:
        raise ConnectionError("registry away")


def test_a_process_reads_every_type_it_registered_without_asking_the_registry():
    """A replica restarted since it last read a type (CI: the registry test's chat met such a replica) reads
    today's records with the registry down: registering a schema also keeps it as the writer of its id."""
    schemas = codec.Schemas(Away(), retry_s=0.0)
    ids = schemas.register_all()
    for name, schema_id in ids.items():
        assert schemas.writer(schema_id)["name"].endswith(name)
    with pytest.raises(RetriableError, match="schema registry unreachable"):
        schemas.writer(max(ids.values()) + 1)  # an id it never registered still needs the registry
