"""What a backup keeps of each table, sealed for it and opened from it (storage/backup.py; the backup and restore
of a real stack: tests/stack/test_erasure.py and tests/stack/test_backup.py)."""

from __future__ import annotations

import json
import re

from storage import backup, schema
from storage.usage import ddl

from .test_sealed import PLANTED, Keys


def test_every_table_is_kept_or_left_out_by_name():
    assert set(backup.CASSANDRA) == schema.tables()
    kept, rollups = set(), set()
    for statement in ddl("db"):
        for table in re.findall(r"CREATE TABLE IF NOT EXISTS db\.(\w+) \(", statement):
            (rollups if "AggregatingMergeTree" in statement else kept).add(table)
    assert set(backup.CLICKHOUSE) == kept and rollups  # the rollups are rebuilt from the usage rows


def test_a_row_is_sealed_with_its_owners_key_and_opens_to_what_it_was():
    keys = Keys()
    kept = backup.CASSANDRA["memories"]
    row = {"user_id": "ada", "memory_id": "m1", "content": PLANTED, "embedding": [0.25, -1.5], "source": "chat"}
    sealed = backup.seal_row(kept, row, "ada", keys)
    assert PLANTED not in json.dumps(sealed) and "0.25" not in json.dumps(sealed) and sealed["source"] == "chat"
    assert sealed[backup.KEY] == keys.owners["ada"]
    assert backup.open_row(kept, json.loads(json.dumps(sealed)), keys) == row
    blob = {"document_id": "d1", "part": 0, "data": "0x" + PLANTED.encode().hex()}
    kept = backup.CASSANDRA["document_blobs"]
    assert backup.open_row(kept, backup.seal_row(kept, blob, "ada", keys), keys) == blob


def test_every_row_of_a_person_erased_since_stays_out_and_their_usage_stays_under_a_pseudonym():
    keys = Keys()
    text = backup.seal_row(backup.CASSANDRA["messages"], {"chat_id": "c", "content": PLANTED}, "ada", keys)
    bare = backup.seal_row(backup.CASSANDRA["api_keys"], {"key_hash": "h", "user_id": "ada"}, "ada", keys)
    usage = backup.seal_row(backup.CLICKHOUSE["usage"], {"run_id": "r", "user_id": "ada", "copied": 1}, "ada", keys)
    bo = backup.seal_row(backup.CASSANDRA["api_keys"], {"key_hash": "g", "user_id": "bo"}, "bo", keys)
    del keys.ciphers[keys.owners["ada"]]  # erased
    assert backup.open_row(backup.CASSANDRA["messages"], text, keys) is None
    assert backup.open_row(backup.CASSANDRA["api_keys"], bare, keys) is None  # no text, still hers
    assert backup.open_row(backup.CASSANDRA["api_keys"], bo, keys) == {"key_hash": "g", "user_id": "bo"}
    pseudonyms: dict[str, str] = {}
    restored = backup.usage_row(usage, keys, pseudonyms)
    assert restored["user_id"] == pseudonyms["ada"] and restored["user_id"].startswith("erased-")
    assert restored["copied"] == 0


def test_a_row_of_nobody_known_is_not_kept():
    keys = Keys()
    # a deleted chat's leftover message: its chat is not in the chats table, so no one's key may seal it
    assert backup.seal_row(backup.CASSANDRA["messages"], {"chat_id": "c", "content": PLANTED}, "", keys) is None
    # an audit record has no owner column: kept as it is
    audit = {"event_id": "e", "actor": "root", "action": "person.erase"}
    assert backup.seal_row(backup.CLICKHOUSE["audit_log"], audit, "", keys) == audit


# The columns of the kept tables that hold words but are not a person's text: ids, names of things, states.
PLAIN = {
    "user_id",
    "owner",
    "username",
    "tier",
    "role",
    "source",
    "kind",
    "model",
    "pool",
    "finish_reason",
    "state",
    "code",
    "day",
    "stage",
    "action",
    "category",
    "policy_version",
    "run_id",
    "chat_id",
    "key_hash",
    "prefix",
    "share_id",
    "k",
    "scopes",
    "last_run_id",
    "in_flight",
    "message",
}


def test_every_column_that_can_hold_words_is_sealed_or_named_plain():
    """A new column of text, bytes or vectors in a kept table fails here until it is sealed or named plain."""
    words = re.compile(r"^(text|blob|vector<.*>|list<text>|set<text>|map<text, ?\w+>)( static)?$")
    columns: dict[str, dict[str, str]] = {}
    for store in schema.STORES:
        for statement in store.SCHEMA:
            found = re.search(r"TABLE IF NOT EXISTS \{ks\}\.(\w+) \((.*)\)", " ".join(statement.split()), re.S)
            if not found:  # an index
                continue
            body = re.sub(r"PRIMARY KEY \(.*", "", found[2])
            for part in re.split(r",\s*(?![^<]*>)", body):
                name, _, kind = part.strip().partition(" ")
                if name:
                    columns.setdefault(found[1], {})[name] = kind.replace(" PRIMARY KEY", "").strip()
        for table, name, kind in getattr(store, "COLUMNS_ADDED", ()):
            columns[table][name] = kind
    unsorted = [
        f"{table}.{name} {kind}"
        for table, kept in backup.CASSANDRA.items()
        if kept is not None
        for name, kind in columns[table].items()
        if words.match(kind) and name not in kept.personal and name not in PLAIN
    ]
    assert not unsorted, unsorted
