"""Usage rows and eval results in ClickHouse (the engine: storage/clickhouse.py), their tables and rollups.

Exactly one row per run: `usage` is a ReplacingMergeTree keyed by (user_id, run_id), and a batch is written
only for the runs it does not hold yet (`UsageStore.write`), so a redelivered or replayed event changes
nothing, neither the row nor the rollups that materialized views fill from each insert. Reads of `usage`
still use FINAL, which also covers two writers racing on one run during a consumer-group rebalance.
Design: docs/decisions/0009-usage-metering.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from runtime.settings import Periods, StackSettings
from storage import audit, search, usage_erasure
from storage.clickhouse import Backend, ChdbBackend, ServerBackend, in_buckets, iso, moment, quote
from storage.usage_report import LATENCIES, QUANTILES, Report

USAGE_COLUMNS = (
    "run_id",
    "event_id",
    "user_id",
    "tier",
    "chat_id",
    "kind",
    "model",
    "pool",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "ttft_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "queue_ms",
    "duration_ms",
    "finish_reason",
    "moderation",
    "cost_usd",
    "created_at",
)
EVAL_COLUMNS = (
    "label",
    "suite",
    "case",
    "pass",
    "refused",
    "checks",
    "scores",
    "prompt_tokens",
    "completion_tokens",
    "ttft_ms",
    "model",
    "policy_version",
    "run_id",
    "answer",
    "error",
    "at",
)
# What reconciliation compares between a row rebuilt from Kafka and the stored one.
COMPARED = (
    "user_id",
    "tier",
    "model",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "finish_reason",
)

# Columns added after the first release, for tables created before them (ADD COLUMN IF NOT EXISTS).
ADDED = (
    "kind LowCardinality(String) DEFAULT 'chat'",
    "itl_p50_ms Float64",
    "itl_p99_ms Float64",
    "queue_ms Float64",
    "moderation LowCardinality(String) DEFAULT 'passed'",
    "cost_usd Decimal(18, 9)",
    "copied UInt8 DEFAULT 0",  # 1: a row moved under an erased person's pseudonym (storage/usage_erasure.py)
)

# Rollups, filled by materialized views on every insert into `usage` (each run arrives there once):
# hourly by tier, model, kind, finish reason and moderation outcome (the dashboards' time series), and daily
# per user, tier and model (per-user views and top users). Latency quantiles are t-digest states of the runs
# that produced a token (a rejected run or one cancelled before its first token has no latency).
_LATENCY_STATES = ", ".join(
    f"{c} AggregateFunction(quantilesTDigest({QUANTILES}), Float64)" for c in LATENCIES
)
_SUMS = (
    "runs SimpleAggregateFunction(sum, UInt64), prompt_tokens SimpleAggregateFunction(sum, UInt64), "
    "cached_tokens SimpleAggregateFunction(sum, UInt64), completion_tokens SimpleAggregateFunction(sum, UInt64), "
    "cost_usd SimpleAggregateFunction(sum, Decimal(38, 9))"
)
_SUM_SELECT = (
    "count() AS runs, sum(toUInt64(prompt_tokens)) AS prompt_tokens, sum(toUInt64(cached_tokens)) AS cached_tokens, "
    "sum(toUInt64(completion_tokens)) AS completion_tokens, sum(toDecimal128(cost_usd, 9)) AS cost_usd"
)
_STATE_SELECT = ", ".join(
    f"quantilesTDigestStateIf({QUANTILES})({c}_ms, ttft_ms > 0) AS {c}" for c in LATENCIES
)
HOURLY_KEY = "hour, tier, model, kind, finish_reason, moderation"
DAILY_KEY = "user_id, day, tier, model"
ROLLUPS = {
    # name: (key columns, the key's SELECT expressions, ORDER BY, bucket function, bucket column)
    "usage_hourly": (
        "hour DateTime('UTC'), tier LowCardinality(String), model LowCardinality(String), "
        "kind LowCardinality(String), finish_reason LowCardinality(String), moderation LowCardinality(String)",
        "toStartOfHour(created_at) AS hour, tier, model, kind, finish_reason, moderation",
        HOURLY_KEY,
        "toStartOfHour",
        "hour",
    ),
    "usage_daily_user": (
        "user_id String, day Date, tier LowCardinality(String), model LowCardinality(String)",
        "user_id, toDate(created_at) AS day, tier, model",
        DAILY_KEY,
        "toDate",
        "day",
    ),
}


def rollup_select(name: str, source: str, where: str = "") -> str:
    """The SELECT that fills a rollup from usage rows: the materialized view's, and a rebuild's."""
    _, select, order, _, _ = ROLLUPS[name]
    return f"SELECT {select}, {_SUM_SELECT}, {_STATE_SELECT} FROM {source}{where} GROUP BY {order}"


def ddl(db: str) -> list[str]:
    statements = [
        f"CREATE DATABASE IF NOT EXISTS {db}",
        f"""CREATE TABLE IF NOT EXISTS {db}.usage (
             run_id String, event_id String, user_id String, tier LowCardinality(String), chat_id String,
             model LowCardinality(String), pool LowCardinality(String),
             prompt_tokens UInt32, completion_tokens UInt32, cached_tokens UInt32,
             ttft_ms Float64, duration_ms Float64, finish_reason LowCardinality(String),
             created_at DateTime64(3, 'UTC'), inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
           ) ENGINE = ReplacingMergeTree(inserted_at) ORDER BY (user_id, run_id)""",
        *(f"ALTER TABLE {db}.usage ADD COLUMN IF NOT EXISTS {column}" for column in ADDED),
    ]
    # One row per eval case run (`parley eval run`): labels compare from here (docs/decisions/0014).
    statements.append(
        f"""CREATE TABLE IF NOT EXISTS {db}.eval_results (
             label String, suite LowCardinality(String), case String, pass UInt8, refused UInt8,
             checks String, scores String, prompt_tokens UInt32, completion_tokens UInt32, ttft_ms Float64,
             model LowCardinality(String), policy_version LowCardinality(String), run_id String, answer String,
             error String, at DateTime64(3, 'UTC')
           ) ENGINE = MergeTree ORDER BY (label, suite, case, at)"""
    )
    statements += audit.ddl(db) + search.ddl(db) + usage_erasure.ddl(db)
    for name, (columns, _, order, _, _) in ROLLUPS.items():
        statements.append(
            f"CREATE TABLE IF NOT EXISTS {db}.{name} ({columns}, {_SUMS}, {_LATENCY_STATES}) "
            f"ENGINE = AggregatingMergeTree ORDER BY ({order})"
        )
        statements.append(view(db, name))
    return statements


def view(db: str, name: str) -> str:
    """A rollup's materialized view. The hourly one skips rows moved under an erased person's pseudonym: their
    runs are counted there already (storage/usage_erasure.py)."""
    where = " WHERE copied = 0" if name == "usage_hourly" else ""
    return (
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.{name}_mv TO {db}.{name} AS "
        + rollup_select(name, f"{db}.usage", where)
    )


# The tables whose rows expire a period after their time (runtime/settings.py Periods): (table, its time as a
# DateTime, the period). A rollup's time is its bucket's end, when its newest run may have been. ClickHouse drops
# an expired row when it merges the row's part, so a row can still be read for a while after its period
# (docs/privacy.md).
EXPIRING = (
    ("usage", "toDateTime(created_at)", "usage"),
    ("usage_hourly", "hour + INTERVAL 1 HOUR", "usage"),
    ("usage_daily_user", "toDateTime(day) + INTERVAL 1 DAY", "usage"),
    ("eval_results", "toDateTime(at)", "evals"),
    ("audit_log", "toDateTime(at)", "audit"),
)


def ttl_seconds(engine_full: str) -> int:
    """A table's TTL period as this module writes it, from system.tables' engine_full (0: none) (pure)."""
    found = re.search(r"\bTTL\b.*toIntervalSecond\((\d+)\)", engine_full)
    return int(found.group(1)) if found else 0


def expire_by_period(backend: Backend, db: str, periods: Periods) -> dict[str, int]:
    """Give each expiring table its period where its TTL differs (ClickHouse then rewrites the table's parts
    to apply it to the rows already there); returns {table: seconds} of those changed."""
    tables = backend.query(
        f"SELECT name, engine_full FROM system.tables WHERE database = {quote(db)}"
    )
    current = {t["name"]: ttl_seconds(t["engine_full"]) for t in tables}
    changed = {}
    for table, at, kind in EXPIRING:
        wanted = periods.seconds(kind)
        if current.get(table, 0) == wanted:
            continue
        backend.command(
            f"ALTER TABLE {db}.{table} "
            + (f"MODIFY TTL {at} + INTERVAL {wanted} SECOND" if wanted else "REMOVE TTL")
        )
        changed[table] = wanted
    return changed


class UsageStore:
    def __init__(
        self, backend: Backend, database: str, create: bool = False, periods: Periods | None = None
    ) -> None:
        self.backend = backend
        self.db = database
        if create:
            for statement in ddl(database):
                backend.command(statement)
            if not usage_erasure.hourly_view_current(
                backend, database
            ):  # made before erasure existed
                backend.command(f"DROP VIEW IF EXISTS {database}.usage_hourly_mv")
                backend.command(view(database, "usage_hourly"))
            expire_by_period(backend, database, periods or Periods())

    @classmethod
    def open(
        cls,
        url: str,
        database: str,
        user: str = "",
        password: str = "",
        create: bool = False,
        periods: Periods | None = None,
    ) -> UsageStore:
        """`chdb:///path/to/dir` for the embedded engine, `http://host:8123` for a server. A server's tables are
        made by the migration (`create`, storage/schema.py), never by a stage at start-up; the embedded engine is
        opened by one process only, so that process makes its own."""
        if url.startswith("chdb://"):
            backend: Backend = ChdbBackend(Path(url.removeprefix("chdb://")))
            return cls(backend, database, create=True, periods=periods)
        return cls(ServerBackend(url, user, password), database, create, periods)

    def write(self, rows: Iterable[dict[str, Any]]) -> int:
        """Insert the rows of runs not stored yet (the last of a run's rows in the batch wins); returns how many.

        One metering consumer owns a run's partition, so checking then inserting does not race in steady
        state; the check is what keeps the rollups exact when a batch is delivered again after a crash
        between this write and the offset commit."""
        batch: dict[tuple[str, str], dict[str, Any]] = {}
        for r in rows:
            batch[(r["user_id"], r["run_id"])] = {k: r[k] for k in USAGE_COLUMNS}
        if not batch:
            return 0
        erased = usage_erasure.pseudonyms(self.backend, self.db, {u for u, _ in batch})
        if (
            erased
        ):  # a run of someone erased since: under their pseudonym (storage/usage_erasure.py)
            moved = [
                {**r, "user_id": erased.get(r["user_id"], r["user_id"])} for r in batch.values()
            ]
            batch = {(r["user_id"], r["run_id"]): r for r in moved}
        keys = ", ".join(f"({quote(u)}, {quote(r)})" for u, r in batch)
        stored = self.backend.query(
            f"SELECT user_id, run_id FROM {self.db}.usage WHERE (user_id, run_id) IN ({keys})"
        )
        for row in stored:
            batch.pop((row["user_id"], row["run_id"]), None)
        if batch:
            self.backend.insert_json(f"{self.db}.usage", list(batch.values()))
        return len(batch)

    def write_evals(self, rows: list[dict[str, Any]]) -> int:
        """Eval case results (`at` in epoch ms)."""
        if rows:
            cols = EVAL_COLUMNS
            self.backend.insert_json(
                f"{self.db}.eval_results",
                [{k: r[k] for k in cols} | {"at": iso(r["at"])} for r in rows],
            )
        return len(rows)

    def evals(self, label: str) -> list[dict[str, Any]]:
        cols = ", ".join(EVAL_COLUMNS)
        return self.backend.query(
            f"SELECT {cols} FROM {self.db}.eval_results WHERE label = {quote(label)} ORDER BY suite, case, at"
        )

    def eval_labels(self) -> list[dict[str, Any]]:
        """Every label's cases, passes and when it ran: what the dashboard lists."""
        return self.backend.query(
            "SELECT label, groupUniqArray(suite) AS suites, count() AS cases, sum(pass) AS passed, "
            f"min(at) AS first_at, max(at) AS last_at FROM {self.db}.eval_results GROUP BY label ORDER BY last_at DESC"
        )

    def rows(self, where: str = "1") -> list[dict[str, Any]]:
        cols = ", ".join(USAGE_COLUMNS)
        return self.backend.query(
            f"SELECT {cols} FROM {self.db}.usage FINAL WHERE {where} ORDER BY created_at"
        )

    def between(self, since_ms: int, until_ms: int) -> list[dict[str, Any]]:
        """The stored rows of runs created in [since, until): what reconciliation compares with the log (an
        embeddings request is metered where it is served, with no record on the log)."""
        window = f"created_at >= {moment(since_ms)} AND created_at < {moment(until_ms)}"
        return self.rows(f"{window} AND kind != 'embedding'")

    def totals(self, user_id: str, since_ms: int = 0) -> dict[str, Any]:
        """A person's totals, and `period_tokens`: the tokens of their runs since `since_ms`."""
        sql = (
            "SELECT count() AS runs, sum(prompt_tokens) AS prompt_tokens, "
            "sum(completion_tokens) AS completion_tokens, sum(cached_tokens) AS cached_tokens, "
            "toFloat64(sum(cost_usd)) AS cost_usd, "
            f"sumIf(u.prompt_tokens + u.completion_tokens, u.created_at >= {moment(since_ms)}) "
            f"AS period_tokens FROM {self.db}.usage AS u FINAL WHERE user_id = {quote(user_id)}"
        )
        row = self.backend.query(sql)[0]
        out: dict[str, Any] = {
            k: int(row[k] or 0)
            for k in (
                "runs",
                "prompt_tokens",
                "completion_tokens",
                "cached_tokens",
                "period_tokens",
            )
        }
        out["cost_usd"] = float(row["cost_usd"] or 0.0)
        return out

    def rollup_drift(self, since_ms: int, until_ms: int) -> list[dict[str, Any]]:
        """Buckets touched by [since, until) whose rollup sums differ from the rows' (each rollup checked by its
        own bucket: hour, day); empty when the materialized views saw each run exactly once."""
        off = []
        for name, (_, _, _, bucket, column) in ROLLUPS.items():
            rows = in_buckets(bucket, f"{bucket}(created_at)", since_ms, until_ms)
            rollup = in_buckets(bucket, column, since_ms, until_ms)
            sums = "sum(prompt_tokens) AS p, sum(cached_tokens) AS k, sum(completion_tokens) AS c"
            sql = (
                f"SELECT toString(b) AS bucket, u.runs AS usage_runs, r.runs AS rollup_runs, u.p AS usage_prompt, "
                f"r.p AS rollup_prompt, u.c AS usage_completion, r.c AS rollup_completion FROM "
                f"(SELECT {bucket}(created_at) AS b, count() AS runs, {sums} FROM {self.db}.usage FINAL "
                f"WHERE {rows} GROUP BY b) AS u "
                f"FULL OUTER JOIN (SELECT {column} AS b, sum(runs) AS runs, {sums} FROM {self.db}.{name} "
                f"WHERE {rollup} GROUP BY b) AS r USING b "
                "WHERE u.runs != r.runs OR u.p != r.p OR u.k != r.k OR u.c != r.c ORDER BY b"
            )
            off += [{"rollup": name, **row} for row in self.backend.query(sql)]
        return off

    def rebuild_rollups(self, since_ms: int, until_ms: int) -> None:
        """Recompute every rollup bucket touched by [since, until) from the usage rows (reconciliation --repair,
        after rows were written back or lost behind the pipeline's back). An operator's tool: runs written
        while it works may be counted twice or not at all; check again after."""
        for name, (_, _, _, bucket, column) in ROLLUPS.items():
            self.backend.command(
                f"ALTER TABLE {self.db}.{name} DELETE WHERE {in_buckets(bucket, column, since_ms, until_ms)} "
                "SETTINGS mutations_sync = 1"
            )
            where = f" WHERE {in_buckets(bucket, f'{bucket}(created_at)', since_ms, until_ms)}"
            self.backend.command(
                f"INSERT INTO {self.db}.{name} "
                + rollup_select(name, f"{self.db}.usage FINAL", where)
            )

    def report(
        self, since_ms: int, until_ms: int, user_id: str | None = None, source: str = "rollup"
    ) -> dict[str, Any]:
        """What the dashboard draws for [since, until): everyone's (from the rollups) or one user's (from the
        usage rows, which are ordered by user). `source="usage"` computes everyone's from the rows instead:
        the baseline the dashboard benchmark compares the rollups with."""
        return Report(self.backend, self.db, since_ms, until_ms, user_id, source).build()

    def close(self) -> None:
        self.backend.close()


def open_usage(settings: StackSettings, create: bool = False) -> UsageStore:
    """The usage store the settings name (PARLEY_USAGE_TARGET: chdb:///dir or a server's URL)."""
    password = settings.usage_password.get_secret_value()
    return UsageStore.open(
        settings.usage_target,
        settings.usage_db,
        settings.usage_user,
        password,
        create,
        settings.periods,
    )
