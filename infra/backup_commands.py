"""`parley backup DIR` and `parley restore DIR`: every chat, usage row and schema of a stack, written out with each
person's text sealed with their own key, and put back onto a fresh cluster (docs/backup.md; what each table
keeps: storage/backup.py). Registered on the CLI by infra/cli.py.

A backup is a folder: the registry's schemas, one gzipped JSON-lines file per table, and last a manifest naming
each file's size, rows and SHA-256. A folder without its manifest is a backup that did not finish; a file whose
digest differs is a damaged one: restore refuses both before it writes anything. The folder is written under
DIR.partial and renamed to DIR once whole.

The keys are not in the backup: they stay on the keys topic (runtime/keys.py), replicated like every topic. A
restore opens the text with the keys there now, so a person erased after the backup was taken stays erased in
what it restores; and it refuses a topic that holds none of the backup's keys (the wrong namespace, or the
keys lost) rather than restoring everyone as erased.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from infra import log_commands
from runtime import keys
from runtime.settings import StackSettings
from storage import backup
from topics.sealed import Keys

# -- backup ----------------------------------------------------------------------------------------------------


def cmd_backup(args: argparse.Namespace) -> None:
    settings, metering = log_commands.stack_settings(args)
    out = Path(args.dir)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} exists and is not empty: name a new folder for the backup")
    keys.check(settings)
    from registry import client as registry

    registry.connect(settings.schema_registry_url)  # the keys' own records are Avro
    # a person with no key yet gets one, as at the edge
    keyring = keys.start(settings, "api", creates=True)
    work = out.with_name(out.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    (work / "cassandra").mkdir(parents=True)
    (work / "clickhouse").mkdir()
    started = time.monotonic()
    files: dict[str, dict[str, Any]] = {}
    used: set[str] = set()
    skipped: dict[str, int] = {}
    try:
        files["registry.json.gz"] = _schemas(settings.schema_registry_url, work)
        from storage.session import connect_session

        session = connect_session(settings.cassandra)
        try:
            owners = backup.Owners(session, settings.keyspace_name)
            for table, kept in backup.CASSANDRA.items():
                if kept is None:
                    continue
                rows = backup.cassandra_rows(session, settings.keyspace_name, table)
                name = f"cassandra/{table}.jsonl.gz"
                files[name], skipped[table] = _write(
                    work / name, table, rows, kept, owners.of, keyring, used
                )
        finally:
            session.cluster.shutdown()
        with httpx.Client(
            base_url=metering, headers=settings.internal_headers(), timeout=600
        ) as usage:
            for table, kept in backup.CLICKHOUSE.items():
                answer = usage.get(f"/backup-rows/{table}")
                answer.raise_for_status()
                found = (json.loads(line) for line in answer.text.splitlines() if line)
                name = f"clickhouse/{table}.jsonl.gz"
                files[name], skipped[table] = _write(
                    work / name,
                    table,
                    found,
                    kept,
                    lambda k, r: str(r.get(k.owner) or ""),
                    keyring,
                    used,
                )
    finally:
        if keyring is not None:
            keyring.stop()
    manifest = {
        "format": backup.FORMAT,
        "taken_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "namespace": settings.namespace,
        "keyspace": settings.keyspace_name,
        "usage_db": settings.usage_db,
        "sealed": keyring is not None,
        "kek_id": keyring.kek_id if keyring is not None else "",
        "key_ids": sorted(used),
        "files": files,
        "skipped": {t: n for t, n in skipped.items() if n},
    }
    (work / backup.MANIFEST).write_text(
        json.dumps(manifest, indent=1)
    )  # last: its presence says the backup is whole
    if out.exists():
        out.rmdir()  # empty, checked above
    work.rename(out)
    total = sum(f["bytes"] for f in files.values())
    print(
        json.dumps(
            {
                "backup": str(out),
                "rows": {k: f["rows"] for k, f in files.items()},
                "bytes": total,
                "seconds": round(time.monotonic() - started, 2),
                "skipped": manifest["skipped"],
            },
            indent=1,
        )
    )


def _schemas(url: str, work: Path) -> dict[str, Any]:
    """Every subject's versions (each with its id) and the compatibility levels."""
    with httpx.Client(base_url=url, timeout=30) as registry:
        level = registry.get("/config").json()["compatibilityLevel"]
        subjects: dict[str, Any] = {}
        for subject in registry.get("/subjects").json():
            versions = [
                registry.get(f"/subjects/{subject}/versions/{v}").json()
                for v in registry.get(f"/subjects/{subject}/versions").json()
            ]
            own = registry.get(f"/config/{subject}").json()["compatibilityLevel"]
            subjects[subject] = {
                "level": own if own != level else None,
                "versions": [
                    {"version": v["version"], "id": v["id"], "schema": v["schema"]}
                    for v in versions
                ],
            }
    out = backup.Digest(work / "registry.json.gz")
    out.write({"level": level, "subjects": subjects})
    return out.close() | {"rows": sum(len(s["versions"]) for s in subjects.values())}


def _write(
    path: Path,
    table: str,
    rows: Iterator[dict[str, Any]],
    kept: backup.Kept,
    owner_of: Any,
    keyring: Keys | None,
    used: set[str],
) -> tuple[dict[str, Any], int]:
    """A table's rows, sealed, to its file: (the file's entry, rows skipped as nobody's)."""
    out = backup.Digest(path)
    skipped = 0
    for row in tqdm(rows, desc=table, unit=" rows", file=sys.stderr, leave=False):
        if keyring is not None:
            sealed = backup.seal_row(kept, row, owner_of(kept, row), keyring)
            if sealed is None:
                skipped += 1
                continue
            if backup.KEY in sealed:
                used.add(str(sealed[backup.KEY]))
            row = sealed
        out.write(row)
    return out.close(), skipped


# -- restore ---------------------------------------------------------------------------------------------------


def verify(folder: Path) -> dict[str, Any]:
    """The manifest of a whole, undamaged backup; SystemExit saying what is wrong otherwise."""
    try:
        manifest = json.loads((folder / backup.MANIFEST).read_text())
    except FileNotFoundError:
        raise SystemExit(
            f"refusing to restore: {folder} has no {backup.MANIFEST}: not a Parley backup, or one that did not finish"
        ) from None
    except ValueError as exc:
        raise SystemExit(
            f"refusing to restore: {folder / backup.MANIFEST} is damaged: {exc}"
        ) from None
    if manifest.get("format") != backup.FORMAT:
        raise SystemExit(
            f"refusing to restore: {folder} is {manifest.get('format')!r}, not {backup.FORMAT}"
        )
    for name, entry in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            raise SystemExit(f"refusing to restore: {name} is missing from {folder}")
        if backup.sha256(path) != entry["sha256"]:
            raise SystemExit(
                f"refusing to restore: {name} is damaged (its SHA-256 is not the manifest's); nothing was written"
            )
    return dict(manifest)


def cmd_restore(args: argparse.Namespace) -> None:
    folder = Path(args.dir)
    manifest = verify(folder)
    settings, _ = log_commands.stack_settings(args)
    started = time.monotonic()
    _read_schemas(folder)
    keyring = _keys(settings, manifest, args.keys_namespace or manifest["namespace"])
    try:
        ids = _restore_schemas(folder, settings.schema_registry_url)
        restored: dict[str, Any] = {"schemas": ids}
        restored |= _restore_cassandra(folder, manifest, settings, keyring)
        restored |= _restore_usage(folder, manifest, settings, keyring)
    finally:
        if keyring is not None:
            keyring.stop()
    print(
        json.dumps(
            {
                "restored": str(folder),
                "to": {"keyspace": settings.keyspace_name, "usage_db": settings.usage_db},
                **restored,
                "seconds": round(time.monotonic() - started, 2),
            },
            indent=1,
        )
    )


def _read_schemas(folder: Path) -> None:
    """The codec reads the keys topic with the backup's own schemas, before any registry has them again."""
    from registry.store import InProcess
    from topics import codec

    saved = next(backup.lines(folder / "registry.json.gz"))
    held = InProcess()
    for subject, entry in saved["subjects"].items():
        for version in entry["versions"]:
            held.register(subject, version["schema"])
    codec.use(codec.Schemas(held))


def _keys(settings: StackSettings, manifest: dict[str, Any], namespace: str) -> keys.Keyring | None:
    """The live keys the backup's text opens with, checked to be the deployment's that sealed it."""
    if not manifest["sealed"]:
        return None
    keys.check(settings)
    keyring = keys.Keyring(settings.kafka_bootstrap, namespace, "api", settings.kek_value())
    keyring.start()
    if manifest["kek_id"] != keyring.kek_id:
        keyring.stop()
        raise SystemExit(
            f"refusing to restore: the backup was sealed under KEK {manifest['kek_id']}, PARLEY_KEK is "
            f"{keyring.kek_id}"
        )
    held = set(manifest["key_ids"])
    if held and not held & set(keyring.rows()):
        keyring.stop()
        raise SystemExit(
            f"refusing to restore: the keys topic of namespace {namespace!r} holds none of the backup's "
            f"{len(held)} data keys (the wrong namespace, or the keys were lost); every person would read as "
            "erased. Name the deployment's keys with --keys-namespace."
        )
    return keyring


def _restore_schemas(folder: Path, url: str) -> dict[str, int]:
    """Each subject's versions registered in order: the registry's ids are the schemas' own (registry/store.py),
    so each comes back with the id the log's records name; a different one is an error."""
    saved = next(backup.lines(folder / "registry.json.gz"))
    wrong = []
    count = 0
    with httpx.Client(base_url=url, timeout=30) as registry:
        registry.put("/config", json={"compatibility": saved["level"]}).raise_for_status()
        for subject, entry in saved["subjects"].items():
            if entry["level"]:
                registry.put(
                    f"/config/{subject}", json={"compatibility": entry["level"]}
                ).raise_for_status()
            for version in entry["versions"]:
                answer = registry.post(
                    f"/subjects/{subject}/versions", json={"schema": version["schema"]}
                )
                answer.raise_for_status()
                if answer.json()["id"] != version["id"]:
                    wrong.append(f"{subject} v{version['version']}")
                count += 1
    if wrong:
        raise SystemExit(f"the registry gave new ids to {', '.join(wrong)}: it is not a fresh one")
    return {"registered": count}


def _restore_cassandra(
    folder: Path, manifest: dict[str, Any], settings: StackSettings, keyring: Keys | None
) -> dict[str, Any]:
    from storage.schema import migrate
    from storage.session import connect_session

    migrate(settings.cassandra)
    session = connect_session(settings.cassandra)
    written: dict[str, int] = {}
    dropped: dict[str, int] = {}
    now = time.time()
    try:
        for table, kept in backup.CASSANDRA.items():
            name = f"cassandra/{table}.jsonl.gz"
            if kept is None or name not in manifest["files"]:
                continue
            inserts = backup.Inserts(session, settings.keyspace_name, table)
            gone = 0
            total = manifest["files"][name]["rows"]
            for row in tqdm(
                backup.lines(folder / name), desc=table, total=total, file=sys.stderr, leave=False
            ):
                opened = backup.open_row(kept, row, keyring) if keyring is not None else row
                ttl = backup.left_s(kept, row, settings.periods, now)
                if opened is None or ttl == 0:
                    gone += 1
                    continue
                inserts.add(opened, ttl)
            written[table] = inserts.close()
            dropped[table] = gone
    finally:
        session.cluster.shutdown()
    return {"cassandra": written, "dropped": {t: n for t, n in dropped.items() if n}}


def _restore_usage(
    folder: Path, manifest: dict[str, Any], settings: StackSettings, keyring: Keys | None
) -> dict[str, Any]:
    from storage.usage import open_usage
    from storage.usage_erasure import digest

    store = open_usage(settings, create=True)
    written: dict[str, int] = {}
    pseudonyms: dict[str, str] = {}
    try:
        for table, kept in backup.CLICKHOUSE.items():
            name = f"clickhouse/{table}.jsonl.gz"
            if name not in manifest["files"]:
                continue
            batch: list[dict[str, Any]] = []
            count = 0
            for row in backup.lines(folder / name):
                if keyring is None:
                    opened: dict[str, Any] | None = row
                elif table == "usage":
                    opened = backup.usage_row(row, keyring, pseudonyms)
                else:
                    opened = backup.open_row(kept, row, keyring)
                if opened is not None:
                    batch.append(opened)
                if len(batch) >= 5000:
                    store.backend.insert_json(f"{store.db}.{table}", batch)
                    count, batch = count + len(batch), []
            if batch:
                store.backend.insert_json(f"{store.db}.{table}", batch)
                count += len(batch)
            written[table] = count
        erased = [{"user_hash": digest(u), "pseudonym": p} for u, p in pseudonyms.items()]
        if erased:  # a late row of theirs is written under the pseudonym too
            store.backend.insert_json(f"{store.db}.erased_people", erased)
    finally:
        store.backend.close()
    return {"clickhouse": written, "usage_pseudonymised": len(pseudonyms)}


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    made = sub.add_parser(
        "backup",
        help="write every chat, usage row and schema to a new folder, each person's text sealed with their key",
    )
    made.add_argument("dir", help="a new (or empty) folder")
    put = sub.add_parser(
        "restore",
        help="put a backup back onto a stack's (fresh) stores: its keyspace, usage database and registry",
    )
    put.add_argument("dir", help="a folder `parley backup` wrote")
    put.add_argument(
        "--keys-namespace",
        default="",
        help="the namespace whose keys topic opens the backup's text (default: the backed-up stack's)",
    )
    for p, fn in ((made, cmd_backup), (put, cmd_restore)):
        log_commands.namespace_option(p)
        p.add_argument("--port-base", type=int, default=8000)
        p.add_argument(
            "--registry-url", default="", help="the schema registry (default: the stack's)"
        )
        p.add_argument(
            "--metering-url", default="", help="the metering stage (default: the stack's)"
        )
        p.set_defaults(fn=fn)
