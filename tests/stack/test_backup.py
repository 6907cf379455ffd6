"""`parley restore` refuses a backup it cannot trust before it writes anything: one that did not finish (no
manifest), one with a damaged file, one whose keys the named keys topic does not hold. (The restore drill itself,
with a person erased after the backup, is tests/stack/test_erasure.py.)"""

import shutil
import tempfile
from pathlib import Path

from storage.session import connect_session

from .backups import cli, take


def test_a_partial_or_damaged_backup_or_one_without_its_keys_is_refused_and_nothing_is_written(live):
    with live.client(live.token("backed-up")) as person:
        assert person.post("/v1/chats", json={"title": "something to back up"}).status_code == 201
    folder = Path(tempfile.mkdtemp(prefix="parley-backup-")) / "whole"
    taken = take(live, folder)
    assert taken["rows"]["cassandra/chats.jsonl.gz"] > 0 and not folder.with_name("whole.partial").exists()
    again = cli("backup", str(folder), "--namespace", live.namespace)
    assert again.returncode == 1 and "not empty" in again.stderr  # never over an existing backup
    target = f"{live.namespace}x"

    def refused(copy: Path, *extra: str) -> str:
        done = cli("restore", str(copy), "--namespace", target, *extra)
        assert done.returncode == 1, done.stdout
        return done.stderr

    partial = folder.with_name("partial")
    shutil.copytree(folder, partial)
    (partial / "manifest.json").unlink()
    assert "no manifest.json" in refused(partial) and "did not finish" in refused(partial)

    damaged = folder.with_name("damaged")
    shutil.copytree(folder, damaged)
    blob = bytearray((damaged / "cassandra/messages.jsonl.gz").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (damaged / "cassandra/messages.jsonl.gz").write_bytes(bytes(blob))
    assert "cassandra/messages.jsonl.gz is damaged" in refused(damaged)

    cut = folder.with_name("cut")
    shutil.copytree(folder, cut)
    (cut / "clickhouse/usage.jsonl.gz").unlink()
    assert "clickhouse/usage.jsonl.gz is missing" in refused(cut)

    elsewhere = refused(folder, "--keys-namespace", f"{live.namespace}nokeys")
    assert "holds none of the backup's" in elsewhere

    session = connect_session(live.stack.settings.cassandra)
    try:
        keyspace = live.stack.settings.model_copy(update={"namespace": target}).keyspace_name
        made = "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s"
        assert not list(session.execute(made, (keyspace,)))  # refused before anything was written
    finally:
        session.cluster.shutdown()
