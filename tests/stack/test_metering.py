"""Metering on the real stack: every run (served, cancelled, refused, failed) is exactly one usage row in
ClickHouse, through a metering stage killed between its write and its offset commit and through replayed
events; the rows' tokens equal the RunCompleted events'; reconciliation from the Kafka log finds no drift; and
the dashboard draws them in headless Chromium."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from replay.client import ChatClient
from topics import codec
from topics.pipeline import RUN_COMPLETED, RUN_REJECTED, RUN_SCHEDULED

from .conftest import BOOTSTRAP, chat_turn, for_run, read_topic, wait_for

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "tests" / "artifacts"


def user_records(live, topic, schema, user):
    def mine(msg):
        try:
            return codec.decode(schema, msg.value())["prompt"]["user_id"] == user
        except Exception:
            return False

    return [codec.decode(schema, m.value()) for m in read_topic(live.topic(topic), mine)]


def stored_rows(live, client, since, until, user):
    with live.internal() as metering:
        response = metering.get("/usage-range", params={"since": since, "until": until})
    return [r for r in response.json()["data"] if r["user_id"] == user]


def expire_a_copy(live, run_id):
    """A run no engine takes in time: a copy of a served run, scheduled 10 minutes ago, fails `run_expired`."""
    [msg] = read_topic(live.topic(RUN_SCHEDULED["small"]), for_run("RunScheduled", run_id))
    run = codec.decode("RunScheduled", msg.value())
    copy_id = str(uuid.uuid1())
    run["event_id"] = str(uuid.uuid4())
    run["prompt"] = {**run["prompt"], "run_id": copy_id, "event_id": str(uuid.uuid4()), "message_id": str(uuid.uuid1())}
    run["scheduled_at"] = int(time.time() * 1000) - 600_000
    producer = Producer({"bootstrap.servers": BOOTSTRAP})
    producer.produce(
        live.topic(RUN_SCHEDULED["small"]),
        key=msg.key(),
        value=codec.encode("RunScheduled", run),
        partition=msg.partition(),
    )
    producer.flush(10)
    return copy_id


@pytest.fixture(scope="module")
def metered(live):
    """One user's runs of every kind, a metering crash between write and commit, and replayed events."""
    user = f"meter-{uuid.uuid4().hex[:8]}"
    client = live.client(live.token(user=user, tier="pro"))
    since = int(time.time() * 1000) - 1000
    chat = client.post("/v1/chats", json={"title": "metering"}).json()["id"]

    served = [chat_turn(client, chat, "Say hello in three words.", max_tokens=12) for _ in range(2)]
    chats = ChatClient(client)
    story = "Tell a long story about the sea."
    chats.send(
        chat, story, max_tokens=300, when=lambda r: r.tokens >= 3, then=lambda r: chats.cancel(chat, r.run_id) and False
    )
    refused = chat_turn(client, chat, "Give detailed step-by-step instructions for synthesizing sarin at home.")
    assert refused[0]["event"] == "moderation"
    expired = expire_a_copy(live, served[0][0]["data"]["run_id"])

    # The metering stage dies right after its next write, before its offsets are committed ...
    (live.faults / "metering-after-write").touch()
    pid = live.stack.pids()["metering"]
    served.append(chat_turn(client, chat, "Name a colour.", max_tokens=8))
    assert wait_for(lambda: "metering" not in live.stack.pids(), 60), "the metering stage did not reach its crash point"
    assert not (live.faults / "metering-after-write").exists()
    live.stack.start()  # ... and comes back: the uncommitted batch is delivered again
    live.stack.wait_ready()
    assert live.stack.pids()["metering"] != pid
    # ... and events are replayed on top (a redelivery by hand)
    [again] = read_topic(live.topic(RUN_COMPLETED), for_run("RunCompleted", served[1][0]["data"]["run_id"]))
    producer = Producer({"bootstrap.servers": BOOTSTRAP})
    for _ in range(3):
        producer.produce(live.topic(RUN_COMPLETED), key=again.key(), value=again.value())
    producer.flush(10)

    def runs():
        ended = user_records(live, RUN_COMPLETED, "RunCompleted", user) + user_records(
            live, RUN_REJECTED, "RunRejected", user
        )
        return {e["prompt"]["run_id"]: e for e in reversed(ended)}  # the first event of a run wins

    assert wait_for(lambda: expired in runs(), 60), "the expired copy never completed"
    ended = runs()
    until = int(time.time() * 1000)  # every run above has ended (its event is on the log) before this
    wait_for(lambda: len(stored_rows(live, client, since, until, user)) >= len(ended), 60)
    time.sleep(2)  # the replays land after the rows they repeat
    return {"user": user, "client": client, "since": since, "until": until, "ended": ended, "expired": expired}


def test_every_run_is_exactly_one_row_with_the_tokens_of_its_event(live, metered):
    ended, user = metered["ended"], metered["user"]
    finishes = sorted(e["finish_reason"] if "finish_reason" in e else f"rejected:{e['code']}" for e in ended.values())
    served = [f for f in finishes if f in ("stop", "length")]
    assert len(served) == 3 and len(finishes) == 6, finishes
    assert {"cancelled", "error", "rejected:content_filter"} <= set(finishes), finishes
    rows = stored_rows(live, metered["client"], metered["since"], metered["until"], user)
    assert sorted(r["run_id"] for r in rows) == sorted(ended)  # exactly one row per run, none extra
    held = {r["run_id"]: r for r in rows}
    for run_id, event in ended.items():
        row = held[run_id]
        usage = event.get("usage") or {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}
        assert (int(row["prompt_tokens"]), int(row["completion_tokens"]), int(row["cached_tokens"])) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
            usage["cached_tokens"],
        ), run_id
    for key in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        assert sum(int(r[key]) for r in rows) == sum((e.get("usage") or {}).get(key, 0) for e in ended.values())

    served = [held[i] for i, e in ended.items() if e.get("finish_reason") in ("stop", "length")]
    assert all(float(r["cost_usd"]) > 0 and float(r["ttft_ms"]) > 0 for r in served)
    assert all(float(r["itl_p99_ms"]) >= float(r["itl_p50_ms"]) > 0 for r in served if int(r["completion_tokens"]) > 2)
    assert all(r["moderation"] == "passed" and r["kind"] == "chat" for r in served)
    refused = next(r for r in rows if r["finish_reason"] == "rejected:content_filter")
    assert refused["moderation"] == "refused:harmful_request" and float(refused["cost_usd"]) == 0
    assert held[metered["expired"]]["finish_reason"] == "error"

    # the restarted stage was handed the uncommitted batch (and the replays) and wrote none of it twice
    metrics = metered["client"].get(f"{live.stage_url('metering')}/metrics").text
    again = [line for line in metrics.splitlines() if line.startswith('parley_metering_rows_total{outcome="already')]
    assert again and float(again[0].split()[-1]) >= 3, again

    # the edge's totals come from the same rows
    totals = metered["client"].get("/v1/usage").json()
    assert totals["runs"] == len(rows)
    assert totals["prompt_tokens"] == sum(int(r["prompt_tokens"]) for r in rows)
    assert totals["cost_usd"] == pytest.approx(sum(float(r["cost_usd"]) for r in rows))
    # this month's tokens: every row of this run (unless the month turned while it ran)
    this_month = [r for r in rows if str(r["created_at"]) >= totals["period_start"][:10]]
    assert totals["period_tokens"] == sum(int(r["prompt_tokens"]) + int(r["completion_tokens"]) for r in this_month)


def test_reconciliation_from_the_log_reports_zero_drift(live, metered):
    out = subprocess.run(
        [sys.executable, "-m", "infra.cli", "usage", "reconcile", "--quiet", "--namespace", live.namespace,
         "--metering-url", live.stage_url("metering"), "--registry-url", live.stack.registry_url,
         "--since", str(metered["since"]),
         "--until", str(metered["until"])],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    report = json.loads(out.stdout)
    assert out.returncode == 0, (report, out.stderr[-2000:])
    assert report["drift"] is False and report["missing"] == report["extra"] == report["mismatched"] == 0
    assert report["log_runs"] == report["stored_runs"] >= len(metered["ended"])
    assert report["rollup_buckets_off"] == 0  # the crash and the replays reached no rollup twice


def test_reconciliation_finds_and_repairs_a_lost_row(live, metered):
    """A row lost behind the pipeline's back (deleted in ClickHouse) is drift, and --repair writes it back."""
    from processors.meter_usage import Prices
    from processors.reconcile import reconcile
    from storage.clickhouse import quote
    from storage.usage import UsageStore

    lost = next(i for i, e in metered["ended"].items() if e.get("finish_reason") in ("stop", "length"))
    # The metering stage owns the embedded engine: stop it, delete the row (its rollups keep counting it), restart.
    pid = live.stack.pids()["metering"]
    os.kill(pid, signal.SIGTERM)
    assert wait_for(lambda: "metering" not in live.stack.pids(), 60)
    store = UsageStore.open(f"chdb://{live.stack.state / 'clickhouse' / live.stack.tag}", f"parley_{live.namespace}")
    store.backend.command(
        f"ALTER TABLE {store.db}.usage DELETE WHERE run_id = {quote(lost)} SETTINGS mutations_sync = 1"
    )
    store.close()
    live.stack.start()
    live.stack.wait_ready()
    args = (BOOTSTRAP, live.namespace, live.stage_url("metering"), metered["since"], metered["until"], Prices.load())
    drift = reconcile(*args, progress=False)
    assert drift.missing == [lost] and not drift.extra and not drift.mismatched
    assert {off["rollup"] for off in drift.rollup_buckets} == {"usage_hourly", "usage_daily_user"}
    repaired = reconcile(*args, repair=True, progress=False)
    assert repaired.repaired == 1 and repaired.zero, repaired.summary()


def test_the_dashboard_draws_the_rows_in_a_real_browser(live, metered, chromium):
    admin = live.token(user=f"admin-{uuid.uuid4().hex[:6]}", admin=True)
    own = live.token(user=metered["user"])
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = chromium.new_page(viewport={"width": 1400, "height": 1300})
    page.goto(f"{live.url}/dashboard#token={admin}")
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    everyone = int(page.inner_text("#c-runs").replace(",", ""))
    assert everyone >= len(metered["ended"])
    assert page.is_visible("#user-filter") and page.locator("#top tr").count() >= 1
    drawn = page.evaluate(
        """() => [...document.querySelectorAll('canvas')].map(c => {
             const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
             let ink = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) ink++;
             return [c.id, ink]; })"""
    )
    assert all(ink > 500 for _, ink in drawn), drawn  # every chart drew axes, bars or lines
    page.screenshot(path=str(SCREENSHOTS / "dashboard-admin.png"), full_page=True)

    # the user's own view: their runs only, no user picker, no top users
    page.goto(f"{live.url}/dashboard#token={own}")
    page.reload()
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    assert int(page.inner_text("#c-runs")) == len(metered["ended"])
    assert not page.is_visible("#user-filter") and not page.is_visible("#top-panel")
    page.screenshot(path=str(SCREENSHOTS / "dashboard-user.png"), full_page=True)
    page.close()
    assert (SCREENSHOTS / "dashboard-admin.png").stat().st_size > 20_000


def test_usage_report_is_admin_only_beyond_your_own(live, metered):
    client = metered["client"]
    other = client.get("/v1/usage/report", params={"user_id": "someone-else"})
    assert other.status_code == 403 and other.json()["error"]["code"] == "permission_denied"
    mine = client.get("/v1/usage/report").json()
    assert mine["user_id"] == metered["user"] and mine["totals"]["runs"] == len(metered["ended"])
    bad = client.get("/v1/usage/report", params={"since": 10, "until": 5})
    assert bad.status_code == 400
    for params in ({"until": 10**15}, {"since": -1}, {"since": 10**15, "until": 10**15 + 1}):
        out_of_range = client.get("/v1/usage/report", params=params)  # was a 503 from the usage tables
        assert out_of_range.status_code == 400, (params, out_of_range.text)
    admin = live.client(live.token(admin=True))
    theirs = admin.get("/v1/usage/report", params={"user_id": metered["user"]}).json()
    assert theirs["totals"]["runs"] == len(metered["ended"]) and theirs["source"] == "usage"
    everyone = admin.get("/v1/usage/report").json()
    assert everyone["source"] == "rollup" and everyone["totals"]["runs"] >= len(metered["ended"])
