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
