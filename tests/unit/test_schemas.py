"""Schema evolution: data written with each released schema must still be readable by the current one.

schemas/released/ holds the schemas as shipped. Changing a schema in schemas/ in a way old data cannot be
read with (a removed default, a type change, a new field without a default) fails here; such a change
needs a new topic version (.vN+1) instead.
"""

import io
import json
from pathlib import Path

import fastavro
import pytest

from topics import codec
from topics.errors import PoisonEvent

RELEASED = codec.SCHEMA_DIR / "released"


def sample(schema: object, named: dict) -> object:
    """A value for any Avro schema, deterministic, exercising every field."""
    if isinstance(schema, str):
        prim = {
            "string": "x",
            "int": 1,
            "long": 2,
            "double": 1.5,
            "float": 0.5,
            "boolean": True,
            "null": None,
            "bytes": b"b",
        }
        return prim[schema] if schema in prim else sample(named[schema], named)
    if isinstance(schema, list):
        return sample(next(s for s in schema if s != "null"), named)
    kind = schema["type"]
    if kind == "record":
        named[schema["name"]] = schema
        named[f"{schema.get('namespace')}.{schema['name']}"] = schema
        return {f["name"]: sample(f["type"], named) for f in schema["fields"]}
    if kind == "enum":
        named[schema["name"]] = schema
        named[f"{schema.get('namespace', 'parley.events')}.{schema['name']}"] = schema
        return schema["symbols"][0]
    if kind == "array":
        return [sample(schema["items"], named)]
    if kind == "map":
        return {"k": sample(schema["values"], named)}
    if kind in ("long", "int") and "logicalType" in schema:
        return 1_700_000_000_000
    return sample(kind, named)


def raw(directory: Path, name: str) -> dict:
    return json.loads((directory / f"{name}.avsc").read_text())


@pytest.mark.parametrize("name", sorted(p.stem for p in RELEASED.glob("*.avsc")))
def test_current_schema_reads_data_written_with_the_released_one(name):
    released = codec.schemas(RELEASED)
    current = codec.schemas()
    assert name in current, f"{name} was removed; publish a new topic version instead"
    named: dict = {}
    for dep in ("Usage", "ChatMessage", "PromptAccepted"):
        sample(raw(RELEASED, dep), named)
    record = sample(raw(RELEASED, name), named)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, released[name], record)
    buf.seek(0)
    fastavro.schemaless_reader(buf, released[name], current[name])  # raises SchemaResolutionError if broken


def test_a_backward_incompatible_change_is_caught(tmp_path):
    """The check above has teeth: a new field without a default cannot read old data."""
    for path in RELEASED.glob("*.avsc"):
        (tmp_path / path.name).write_text(path.read_text())
    broken = raw(RELEASED, "RunCompleted")
    broken["fields"].append({"name": "new_required", "type": "string"})
    (tmp_path / "RunCompleted.avsc").write_text(json.dumps(broken))
    named: dict = {}
    for dep in ("Usage", "ChatMessage", "PromptAccepted"):
        sample(raw(RELEASED, dep), named)
    old, new = codec.schemas(RELEASED)["RunCompleted"], codec.schemas(tmp_path)["RunCompleted"]
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, old, sample(raw(RELEASED, "RunCompleted"), named))
    buf.seek(0)
    with pytest.raises(fastavro.read.SchemaResolutionError):
        fastavro.schemaless_reader(buf, old, new)


def test_roundtrip_and_poison():
    named: dict = {}
    sample(raw(codec.SCHEMA_DIR, "Usage"), named)
    sample(raw(codec.SCHEMA_DIR, "ChatMessage"), named)
    record = sample(raw(codec.SCHEMA_DIR, "PromptAccepted"), named)
    decoded = codec.decode("PromptAccepted", codec.encode("PromptAccepted", record))
    assert decoded["content"] == record["content"] and decoded["run_id"] == record["run_id"]
    for garbage in (b"", b"\xff\xfe not avro", b'{"json": true}', codec.encode("PromptAccepted", record) + b"x"):
        with pytest.raises(PoisonEvent):
            codec.decode("PromptAccepted", garbage)
