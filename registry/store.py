"""The registry's state: schemas by id, each subject's versions, compatibility levels; rebuilt from `_schemas`.

Ids are derived from a schema's content (its JSON with sorted keys), so every registry replica gives the same
schema the same id without electing a writer; a hash collision with a different schema takes the next free id.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import avro.schema
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)
DEFAULT_LEVEL = "BACKWARD"


class Invalid(ValueError):
    """Not an Avro schema."""


class Incompatible(ValueError):
    """A schema its subject's compatibility level refuses."""


def canonical(schema: str) -> str:
    """The schema's identity: its JSON with sorted keys and no spaces (docs and defaults count)."""
    try:
        return json.dumps(json.loads(schema), sort_keys=True, separators=(",", ":"))
    except ValueError as exc:
        raise Invalid(f"not JSON: {exc}") from exc


def content_id(text: str) -> int:
    """A positive 31-bit id from the canonical text (0 is never used)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") & 0x7FFF_FFFF or 1


def parse(schema: str) -> avro.schema.Schema:
    try:
        return avro.schema.parse(schema)
    except Exception as exc:  # avro raises SchemaParseException and others
        raise Invalid(str(exc)) from exc


def compatible(new: str, old: str, level: str) -> list[str]:
    """Why `new` cannot replace `old` under a level (empty: it can). BACKWARD: the new schema reads data written
    with the old; FORWARD: the old reads the new; FULL: both."""
    checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
    pairs = []
    if level.startswith(("BACKWARD", "FULL")):
        pairs.append((parse(new), parse(old)))
    if level.startswith(("FORWARD", "FULL")):
        pairs.append((parse(old), parse(new)))
    problems = []
    for reader, writer in pairs:
        result = checker.get_compatibility(reader, writer)
        if result.compatibility is not SchemaCompatibilityType.compatible:
            problems += [
                f"{loc}: {msg}" for msg, loc in zip(result.messages, result.locations, strict=False)
            ] or [str(result.messages)]
    return problems


@dataclass
class Store:
    by_id: dict[int, str] = field(default_factory=dict)  # id -> canonical schema
    versions: dict[str, list[int]] = field(default_factory=dict)  # subject -> ids, version 1 first
    levels: dict[str, str] = field(
        default_factory=dict
    )  # subject ("" : global) -> compatibility level

    # -- the log ----------------------------------------------------------------------------------------
    def apply(self, key: dict[str, Any], value: dict[str, Any] | None) -> None:
        """One `_schemas` record (also what this replica just wrote)."""
        if key.get("keytype") == "CONFIG":
            subject = key.get("subject") or ""
            if value is None:
                self.levels.pop(subject, None)
            else:
                self.levels[subject] = value["compatibilityLevel"]
        elif key.get("keytype") == "SCHEMA" and value is not None:
            self.by_id[value["id"]] = value["schema"]
            ids = self.versions.setdefault(value["subject"], [])
            if value["version"] > len(ids):
                ids.extend([value["id"]] * (value["version"] - len(ids)))
            ids[value["version"] - 1] = value["id"]

    # -- reads ------------------------------------------------------------------------------------------
    def level(self, subject: str) -> str:
        return self.levels.get(subject) or self.levels.get("") or DEFAULT_LEVEL

    def version_of(self, subject: str, text: str) -> int | None:
        ids = self.versions.get(subject, [])
        return next((v for v, i in enumerate(ids, 1) if self.by_id[i] == text), None)

    def problems(self, subject: str, text: str, against: list[int] | None = None) -> list[str]:
        """Why `text` may not be registered under `subject` (against the versions its level names)."""
        level = self.level(subject)
        ids = self.versions.get(subject, [])
        if level == "NONE" or not ids:
            return []
        chosen = (
            against if against is not None else (ids if level.endswith("TRANSITIVE") else ids[-1:])
        )
        return [p for i in chosen for p in compatible(text, self.by_id[i], level)]

    def new_id(self, text: str) -> int:
        """The id `text` has, or the id it is to get."""
        known = next((i for i, t in self.by_id.items() if t == text), None)
        if known is not None:
            return known
        candidate = content_id(text)
        while candidate in self.by_id:
            candidate = candidate % 0x7FFF_FFFF + 1
        return candidate

    def registration(self, subject: str, text: str) -> tuple[int, dict[str, Any] | None]:
        """(id, the `_schemas` record to write, None when the subject already has this schema)."""
        if (number := self.version_of(subject, text)) is not None:
            return self.versions[subject][number - 1], None
        problems = self.problems(subject, text)
        if problems:
            raise Incompatible(
                f"incompatible with {subject} ({self.level(subject)}): {'; '.join(problems)}"
            )
        schema_id = self.new_id(text)
        version = len(self.versions.get(subject, [])) + 1
        return schema_id, {
            "subject": subject,
            "version": version,
            "id": schema_id,
            "schema": text,
            "deleted": False,
        }


def schema_key(record: dict[str, Any]) -> dict[str, Any]:
    return {"keytype": "SCHEMA", "subject": record["subject"], "version": record["version"]}


class InProcess:
    """The registry's rules without its service, for tests of pure logic and one-off tools: the same ids, the
    same compatibility checks, kept in memory."""

    def __init__(self) -> None:
        self.store = Store()

    def register(self, subject: str, schema: str) -> int:
        schema_id, record = self.store.registration(subject, canonical(schema))
        if record is not None:
            self.store.apply(schema_key(record), record)
        return schema_id

    def fetch(self, schema_id: int) -> str | None:
        return self.store.by_id.get(schema_id)
