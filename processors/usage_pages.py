"""The metering stage's internal pages: usage reads and repairs for the edge and the CLI, and eval results.

The embedded ClickHouse engine is opened by the metering process alone, so everything else reads and writes
usage through these pages, each behind the stack's internal token.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from faust.web import View

from processors.stage import Stage
from storage import audit, backup
from storage.clickhouse import quote
from storage.usage import UsageStore

log = logging.getLogger(__name__)

T = TypeVar("T")


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """The engine's calls block: they run on the loop's thread pool."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def add(stage: Stage, store: UsageStore) -> None:
    run = in_thread

    @stage.app.page("/usage/{user_id}")
    async def totals(web: Any, request: Any, user_id: str) -> Any:
        stage.require_internal(request)
        return web.json(await run(store.totals, user_id, int(request.query.get("since", 0))))

    @stage.app.page("/audit")
    async def audit_rows(web: Any, request: Any) -> Any:
        """?since=&until= (epoch ms)[&actor=][&target_user=][&action=][&limit=]: the audit record, newest first."""
        stage.require_internal(request)
        q = request.query
        found = await run(
            audit.read,
            store.backend,
            store.db,
            int(q["since"]),
            int(q["until"]),
            q.get("actor", ""),
            q.get("target_user", ""),
            q.get("action", ""),
            min(int(q.get("limit", 200)), 1000),
        )
        return web.json({"data": found})

    @stage.app.page("/usage-rows/{run_id}")
    async def rows(web: Any, request: Any, run_id: str) -> Any:
        stage.require_internal(request)
        return web.json({"data": await run(store.rows, f"run_id = {quote(run_id)}")})

    @stage.app.page("/usage-range")
    async def between(web: Any, request: Any) -> Any:
        """?since=&until= (epoch ms): the stored rows in the range, for reconciliation."""
        stage.require_internal(request)
        since, until = int(request.query["since"]), int(request.query["until"])
        return web.json({"data": await run(store.between, since, until)})

    @stage.app.page("/usage-rollup-check")
    async def rollup_check(web: Any, request: Any) -> Any:
        """?since=&until= (epoch ms): rollup buckets whose sums differ from the rows'."""
        stage.require_internal(request)
        since, until = int(request.query["since"]), int(request.query["until"])
        return web.json({"data": await run(store.rollup_drift, since, until)})

    @stage.app.page("/usage-report")
    async def report(web: Any, request: Any) -> Any:
        """?since=&until= (epoch ms)[&user_id=][&source=rollup|usage]: what the dashboard draws."""
        stage.require_internal(request)
        q = request.query
        args = (
            int(q["since"]),
            int(q["until"]),
            q.get("user_id") or None,
            q.get("source", "rollup"),
        )
        return web.json(await run(store.report, *args))

    @stage.app.page("/backup-rows/{table}")
    async def backup_rows(web: Any, request: Any, table: str) -> Any:
        """A kept table's rows as JSONEachRow, for `parley backup` (storage/backup.py seals their text)."""
        stage.require_internal(request)
        if table not in backup.CLICKHOUSE:
            return web.json({"error": f"{table} is not a table a backup keeps"}, status=404)
        text = await run(store.backend.dump, f"SELECT * FROM {store.db}.{table}")
        log.info("backup: %s read, %d bytes", table, len(text))
        return web.text(text, content_type="application/x-ndjson")

    @stage.app.page("/eval-results")
    class Evals(View):
        async def get(self, request: Any) -> Any:
            """?label=: one label's eval case results; no label: every label's totals."""
            stage.require_internal(request)
            label = request.query.get("label")
            found = await run(store.evals, label) if label else await run(store.eval_labels)
            return self.json({"data": found})

        async def post(self, request: Any) -> Any:
            """{"rows": [...]}: eval case results (`parley eval run`)."""
            stage.require_internal(request)
            body = await request.json()
            written = await run(store.write_evals, body["rows"])
            log.info(
                "evals: %d case results stored for label %s",
                written,
                body["rows"][0]["label"] if written else "-",
            )
            return self.json({"written": written})

    @stage.app.page("/usage-rollup-rebuild")
    class Rebuild(View):
        async def post(self, request: Any) -> Any:
            """{"since", "until"} (epoch ms): recompute the rollup buckets of the range from the rows."""
            stage.require_internal(request)
            body = await request.json()
            await run(store.rebuild_rollups, int(body["since"]), int(body["until"]))
            log.info("usage repair: rollups rebuilt for %s..%s", body["since"], body["until"])
            return self.json({"rebuilt": True})

    @stage.app.page("/usage-repair")
    class Repair(View):
        async def post(self, request: Any) -> Any:
            """{"rows": [...]}: rows rebuilt from the log for runs missing here (reconciliation --repair)."""
            stage.require_internal(request)
            body = await request.json()
            written = await run(store.write, body["rows"])
            log.info("usage repair: %d rows written of %d sent", written, len(body["rows"]))
            return self.json({"written": written})
