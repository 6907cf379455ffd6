"""The usage dashboard's report: its queries written once for two sources, the rollups (aggregate states) or the
usage rows (one user's, or everyone's as the baseline the dashboard benchmark compares the rollups with)."""

from __future__ import annotations

from typing import Any

from storage.clickhouse import Backend, in_buckets, moment, quote

QUANTILES = "0.5, 0.95, 0.99"
LATENCIES = ("ttft", "itl_p50", "itl_p99", "queue")  # rollup column <- usage column + "_ms"


class Report:
    """The dashboard's queries, written once for two sources: the rollups (aggregate states) or the rows."""

    def __init__(
        self,
        backend: Backend,
        db: str,
        since_ms: int,
        until_ms: int,
        user_id: str | None,
        source: str,
    ) -> None:
        self.backend, self.db = backend, db
        self.since, self.until = since_ms, until_ms
        self.hours = (until_ms - since_ms) / 3_600_000
        self.rows = user_id is not None or source == "usage"
        # hour-aligned like the hourly rollup, so both sources answer for the same runs
        where = (
            f"created_at >= toStartOfHour({moment(since_ms)}) AND created_at < {moment(until_ms)}"
        )
        if user_id is not None:
            where += f" AND user_id = {quote(user_id)}"
        self.user_id = user_id
        if self.rows:
            self.source, self.where, self.time = f"{self.db}.usage FINAL", where, "created_at"
        else:
            self.source = f"{self.db}.usage_hourly"
            self.where = f"hour >= toStartOfHour({moment(since_ms)}) AND hour < {moment(until_ms)}"
            self.time = "hour"

    def runs(self, condition: str = "1") -> str:
        return f"countIf({condition})" if self.rows else f"sumIf(runs, {condition})"

    def quantiles(self, name: str) -> str:
        if self.rows:
            return f"quantilesTDigestIf({QUANTILES})({name}_ms, ttft_ms > 0)"
        return f"quantilesTDigestMerge({QUANTILES})({name})"

    def query(self, select: str, group: str = "", order: str = "") -> list[dict[str, Any]]:
        sql = f"SELECT {select} FROM {self.source} WHERE {self.where}"
        if group:
            sql += f" GROUP BY {group}"
        if order:
            sql += f" ORDER BY {order}"
        # `sum(runs) AS runs`: the column, not the alias, inside the aggregate
        return self.backend.query(sql + " SETTINGS prefer_column_name_to_alias = 1")

    def sums(self) -> str:
        return (
            f"{self.runs()} AS runs, sum(prompt_tokens) AS prompt_tokens, sum(cached_tokens) AS cached_tokens, "
            "sum(completion_tokens) AS completion_tokens, toFloat64(sum(cost_usd)) AS cost_usd"
        )

    def build(self) -> dict[str, Any]:
        step = "toStartOfHour" if self.hours <= 72 else "toStartOfDay"
        bucket = f"toUnixTimestamp({step}({self.time})) * 1000"
        rejected = "startsWith(finish_reason, 'rejected:')"
        intervened = "moderation NOT IN ('passed', 'unscreened')"
        latency = ", ".join(f"{self.quantiles(c)} AS {c}" for c in LATENCIES)
        series = self.query(
            f"{bucket} AS t, {self.sums()}, {self.runs(rejected)} AS rejected, {self.runs(intervened)} AS "
            f"interventions, {latency}",
            "t",
            "t",
        )
        for point in series:
            for c in (
                LATENCIES
            ):  # [p50, p95, p99]; nan or null when no run in the bucket produced a token
                point[c] = [None if v is None or v != v else round(float(v), 1) for v in point[c]]
        report: dict[str, Any] = {
            "since": self.since,
            "until": self.until,
            "user_id": self.user_id,
            "source": "usage" if self.rows else "rollup",
            "bucket": "hour" if step == "toStartOfHour" else "day",
            "totals": (self.query(self.sums()) or [{}])[0],
            "series": series,
            "by_tier_model": self.query(
                f"tier, model, {self.sums()}", "tier, model", "sum(prompt_tokens) DESC"
            ),
            "outcomes": self.query(
                f"finish_reason, {self.runs()} AS runs", "finish_reason", f"{self.runs()} DESC"
            ),
            "safety": self.query(
                f"moderation, {self.runs()} AS runs", "moderation", f"{self.runs()} DESC"
            ),
        }
        if self.user_id is None:
            report["top_users"] = self.top_users()
        return report

    def top_users(self) -> list[dict[str, Any]]:
        """Everyone's heaviest users: from the rows of the report's range, or from the daily per-user rollup
        (whole days)."""
        if self.rows:
            source = f"{self.source} WHERE {self.where}"
        else:
            source = f"{self.db}.usage_daily_user WHERE {in_buckets('toDate', 'day', self.since, self.until)}"
        return self.backend.query(
            f"SELECT user_id, {self.runs()} AS runs, sum(prompt_tokens) + sum(completion_tokens) AS tokens, "
            f"toFloat64(sum(cost_usd)) AS cost_usd FROM {source} GROUP BY user_id ORDER BY tokens DESC LIMIT 10 "
            "SETTINGS prefer_column_name_to_alias = 1"
        )
