"""Usage rows on the embedded ClickHouse engine (chdb, the same SQL a ClickHouse server runs): one row per run
under redelivery, rollups that count each run once, the dashboard report from rollups equal to the one from
the rows, prices, and the drift reconciliation finds."""

import time
import uuid
from decimal import Decimal

import pytest

from processors.meter_usage import Prices, completed_row, rejected_row
from processors.reconcile import compare
from runtime.settings import Periods
from storage import audit
from storage.usage import UsageStore, expire_by_period, ttl_seconds
from storage.usage_erasure import pseudonymise

PRICES = Prices({"m-small": {"prompt": 0.05, "cached": 0.025, "completion": 0.2}})


def completed(user="ann", tier="pro", model="m-small", prompt=100, cached=40, completion=20, finish="stop", at=None):
    run_id = str(uuid.uuid1())
    return {
        "event_id": str(uuid.uuid4()),
        "prompt": {"run_id": run_id, "user_id": user, "tier": tier, "chat_id": "c1", "summary": None, "messages": None},
        "pool": "small",
        "model": model,
        "finish_reason": finish,
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "cached_tokens": cached},
        "ttft_ms": 120.0 if completion else 0.0,
        "itl_p50_ms": 30.0,
        "itl_p99_ms": 80.0,
        "queue_ms": 5.0,
        "duration_ms": 900.0,
        "moderation": "passed",
        "completed_at": at or int(time.time() * 1000),
    }


def rejected(user="bob", code="content_filter", category="violence"):
    return {
        "event_id": str(uuid.uuid4()),
        "prompt": {"run_id": str(uuid.uuid1()), "user_id": user, "tier": "free", "chat_id": "c2", "model": None},
        "code": code,
        "category": category,
        "rejected_at": int(time.time() * 1000),
    }


@pytest.fixture()
def store(tmp_path):
    s = UsageStore.open(f"chdb://{tmp_path}", "parley_test")
    yield s
    s.close()


def test_cost_follows_the_price_table_to_the_nano_dollar():
    # 60 uncached prompt tokens at $0.05/M, 40 cached at $0.025/M, 20 answer tokens at $0.20/M
    assert PRICES.cost("m-small", 100, 40, 20) == Decimal("0.000008000")
    assert PRICES.cost("unknown-model", 100, 0, 20) == Decimal(0)


def test_a_redelivered_batch_adds_no_row_and_no_rollup(store):
    events = [completed(), completed(user="bob", tier="free"), completed(finish="cancelled", completion=0)]
    rows = [completed_row(e, PRICES) for e in events] + [rejected_row(rejected())]
    assert store.write(rows) == 4
    assert store.write(rows) == 0  # the batch again, as after a crash before the offset commit
    assert store.write([rows[0], rows[0]]) == 0
    now = int(time.time() * 1000)
    stored = store.between(now - 60_000, now + 60_000)
    assert len(stored) == 4
    assert store.backend.query("SELECT count() AS n FROM parley_test.usage")[0]["n"] == 4  # not only under FINAL
    assert store.rollup_drift(now - 60_000, now + 60_000) == []
    hourly = store.backend.query("SELECT sum(runs) AS runs, sum(prompt_tokens) AS p FROM parley_test.usage_hourly")
    assert hourly == [{"runs": 4, "p": 300}]
    assert store.totals("ann") == {
        "runs": 2,
        "prompt_tokens": 200,
        "completion_tokens": 20,
        "cached_tokens": 80,
        "cost_usd": pytest.approx(0.000012),
        "period_tokens": 220,  # every row since the epoch
    }
    assert store.totals("ann", since_ms=now + 60_000)["period_tokens"] == 0  # none since a minute from now


def test_the_report_from_rollups_equals_the_report_from_rows(store):
    now = int(time.time() * 1000)
    events = [completed(user=f"u{i % 3}", tier=("free", "pro")[i % 2], prompt=50 + i, at=now - i * 600_000)
              for i in range(30)]  # fmt: skip
    store.write([completed_row(e, PRICES) for e in events] + [rejected_row(rejected()) for _ in range(3)])
    since, until = now - 24 * 3_600_000, now + 60_000
    fast, slow = store.report(since, until), store.report(since, until, source="usage")
    assert fast["source"] == "rollup" and slow["source"] == "usage"
    assert fast["totals"] == slow["totals"] and fast["totals"]["runs"] == 33
    assert sum(p["rejected"] for p in fast["series"]) == 3
    assert sum(p["interventions"] for p in fast["series"]) == 3  # refused by input moderation
    for a, b in zip(fast["series"], slow["series"], strict=True):
        assert {k: a[k] for k in ("t", "runs", "prompt_tokens", "rejected")} == {
            k: b[k] for k in ("t", "runs", "prompt_tokens", "rejected")
        }
        assert a["ttft"][0] == b["ttft"][0]
    assert sorted(map(str, fast["by_tier_model"])) == sorted(map(str, slow["by_tier_model"]))
    assert {u["user_id"] for u in fast["top_users"]} == {"u0", "u1", "u2", "bob"}
    mine = store.report(since, until, user_id="u1")
    assert mine["totals"]["runs"] == 10 and "top_users" not in mine


def test_a_users_report_with_only_refused_runs_has_no_latencies_and_no_error(store):
    """Found by fuzzing the live edge: a user whose runs in a bucket never produced a token (all refused, or
    all cancelled before one) made the report fail, and the edge answered 503."""
    now = int(time.time() * 1000)
    store.write([rejected_row(rejected(user="carol")), completed_row(completed(user="carol", completion=0), PRICES)])
    report = store.report(now - 3_600_000, now + 60_000, user_id="carol")
    assert report["totals"]["runs"] == 2
    assert [p["ttft"] for p in report["series"]] == [[None, None, None]]


def test_compare_finds_missing_extra_and_mismatched_runs():
    a, b, c = (completed_row(completed(), PRICES) for _ in range(3))
    log = {r["run_id"]: r for r in (a, b)}
    changed = {**b, "completion_tokens": b["completion_tokens"] + 1}
    drift = compare(log, [changed, c], 0, 1)
    assert drift.missing == [a["run_id"]] and drift.extra == [c["run_id"]]
    assert drift.mismatched == [{"run_id": b["run_id"], "log_vs_stored": {"completion_tokens": (20, 21)}}]
    assert not drift.zero
    assert compare(log, [a, b], 0, 1).zero
    moved = {**a, "user_id": "erased-0123456789abcdef"}  # an erased person's row: the log still has their id
    assert compare({a["run_id"]: a}, [moved], 0, 1).zero


def test_the_grafana_dashboard_sql_runs_on_the_same_tables(store):
    """infra/grafana's panels query the rollups of a ClickHouse server; their SQL (macros expanded as the
    plugin does) runs here on the embedded engine against the same schema."""
    import json
    import re

    from runtime.settings import REPO_ROOT

    store.write([completed_row(completed(), PRICES), rejected_row(rejected())])
    dashboard = json.loads((REPO_ROOT / "infra/grafana/dashboards/parley-usage.json").read_text())
    answered = {}
    for panel in dashboard["panels"]:
        [target] = panel["targets"]
        assert target["datasource"]["uid"] == "parley-clickhouse"
        sql = target["rawSql"].replace("parley.", "parley_test.")
        sql = re.sub(r"\$__timeFilter\((\w+)\)", r"\1 >= now() - INTERVAL 1 DAY AND \1 <= now() + INTERVAL 1 HOUR", sql)
        sql = re.sub(r"\$__timeInterval\((\w+)\)", r"toStartOfInterval(\1, INTERVAL 3600 second)", sql)
        answered[panel["title"]] = store.backend.query(sql)
    assert all(answered.values()), answered  # every panel has data to draw
    assert answered["Safety interventions"] == [{"outcome": "refused:violence", "run_count": 1}]


def test_rebuilding_rollups_restores_what_a_lost_row_broke(store):
    now = int(time.time() * 1000)
    rows = [completed_row(completed(), PRICES) for _ in range(3)]
    store.write(rows)
    store.backend.command(
        f"ALTER TABLE parley_test.usage DELETE WHERE run_id = '{rows[0]['run_id']}' SETTINGS mutations_sync = 1"
    )
    assert {d["rollup"] for d in store.rollup_drift(now - 1000, now + 1000)} == {"usage_hourly", "usage_daily_user"}
    assert store.write([rows[0]]) == 1  # written back (reconciliation --repair): the rollups now count it twice
    assert store.rollup_drift(now - 1000, now + 1000)
    store.rebuild_rollups(now - 1000, now + 1000)
    assert store.rollup_drift(now - 1000, now + 1000) == []
    assert store.report(now - 3_600_000, now + 60_000)["totals"]["runs"] == 3


def test_rows_expire_by_the_settings_periods_and_a_shorter_period_reaches_rows_already_kept(tmp_path):
    """Usage rows and their rollups, eval results and the audit record expire their period after their time
    (storage/usage.py EXPIRING): a row already past it is never kept, a row within it is until a merge after it
    ends; a changed period is applied to the rows already there, and an unchanged one rewrites nothing."""
    minute, hour = 60 / 86_400, 3600 / 86_400
    store = UsageStore.open(f"chdb://{tmp_path}", "t", periods=Periods(usage=hour, evals=minute, audit=0))
    try:  # closed even on a failure: one process holds one chdb folder at a time
        now = int(time.time() * 1000)
        # two days old: its daily bucket ended over a day ago whatever the hour (a rollup expires by its bucket's end)
        fresh, day_old = completed(at=now - 30_000), completed(user="bo", at=now - 2 * 86_400_000)
        assert store.write([completed_row(e, PRICES) for e in (fresh, day_old)]) == 2
        evals = [
            {
                "label": "a",
                "suite": "s",
                "case": c,
                "pass": 1,
                "refused": 0,
                "checks": "",
                "scores": "",
                "prompt_tokens": 1,
                "completion_tokens": 1,
                "ttft_ms": 1.0,
                "model": "m",
                "policy_version": "p",
                "run_id": "r",
                "answer": "",
                "error": "",
                "at": at,
            }
            for c, at in (("new", now), ("old", now - 120_000))
        ]
        store.write_evals(evals)
        audit.write(store.backend, "t", [{"event_id": "e1", "at": now - 10 * 86_400_000, "actor": "root"}])

        def kept(table: str, column: str) -> set:
            store.backend.command(f"OPTIMIZE TABLE t.{table} FINAL")
            return {r[column] for r in store.backend.query(f"SELECT {column} FROM t.{table}")}

        assert kept("usage", "user_id") == {"ann"} and kept("usage_daily_user", "user_id") == {"ann"}
        assert kept("eval_results", "case") == {"new"}
        assert kept("audit_log", "event_id") == {"e1"}  # 0 days: kept until deleted
    finally:
        store.close()

    shorter = Periods(usage=10 / 86_400, evals=minute, audit=5)
    store = UsageStore.open(f"chdb://{tmp_path}", "t", periods=shorter)
    try:
        assert kept("usage", "user_id") == set()  # 30 s old: past the new period, gone from the rows already there
        assert kept("audit_log", "event_id") == set()
        assert expire_by_period(store.backend, "t", shorter) == {}  # the same periods: no table rewritten
        assert (
            ttl_seconds(
                store.backend.query("SELECT engine_full FROM system.tables WHERE name = 'usage_hourly'")[0][
                    "engine_full"
                ]
            )
            == 10
        )
        assert expire_by_period(store.backend, "t", Periods(usage=0, evals=minute, audit=5)) == {
            "usage": 0,
            "usage_hourly": 0,
            "usage_daily_user": 0,
        }
    finally:
        store.close()


def test_an_erased_persons_rows_move_under_a_pseudonym_and_every_total_and_rollup_stays_right(store):
    """storage/usage_erasure.py: the person's rows and daily rollup rows are under a pseudonym, nothing under
    their id; hourly totals count each run once; a late row of theirs lands under the same pseudonym; the
    rollups agree with the rows (reconciliation finds nothing)."""
    now = int(time.time() * 1000)
    rows = [completed_row(completed(user=u, at=now - 1000 * i), PRICES) for i, u in enumerate(["ann"] * 3 + ["bo"])]
    assert store.write(rows) == 4
    before = store.report(now - 3_600_000, now + 60_000)["totals"]

    pseudonym, moved = pseudonymise(store.backend, store.db, "ann")
    assert moved == 3 and pseudonym.startswith("erased-")
    assert store.backend.query("SELECT count() AS n FROM parley_test.usage WHERE user_id = 'ann'")[0]["n"] == 0
    daily = {r["user_id"] for r in store.backend.query("SELECT user_id FROM parley_test.usage_daily_user")}
    assert daily == {pseudonym, "bo"}
    assert store.report(now - 3_600_000, now + 60_000)["totals"] == before  # hourly: each run counted once
    assert store.rollup_drift(now - 3_600_000, now + 60_000) == []
    assert store.write([rows[0]]) == 0  # delivered again after a crash: already there, under the pseudonym
    late = completed_row(completed(user="ann"), PRICES)
    assert store.write([late]) == 1
    assert store.backend.query(f"SELECT user_id FROM parley_test.usage WHERE run_id = '{late['run_id']}'") == [
        {"user_id": pseudonym}
    ]
    assert pseudonymise(store.backend, store.db, "ann") == (pseudonym, 0)  # erased again: the same pseudonym
    assert store.rollup_drift(now - 3_600_000, now + 60_000) == []
    assert "ann" not in str(store.backend.query("SELECT * FROM parley_test.erased_people"))
