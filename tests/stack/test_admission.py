"""Admission control on the real stack (two replicas of the edge, moderation, scheduling and persistence):
token budgets, per-user concurrency, bounded queues and degradation, limits changed at run time, and a
scheduler restart that loses and double-counts nothing."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
from confluent_kafka import Producer

from replay.client import ChatClient
from tests.stack.conftest import BOOTSTRAP, for_run, read_topic, wait_for
from topics.pipeline import PROMPT_MODERATED, RUN_COMPLETED, RUN_SCHEDULED, TOKEN_DELTA


def set_limits(live, user: str, **fields) -> None:
    with live.client(live.token("root", "pro", admin=True)) as admin:
        response = admin.put(f"/v1/admin/limits/users/{user}", json=fields)
        assert response.status_code == 200, response.text


def post(live, token: str, replica: int = 0, content: str = "Say hello.", **body):
    """(status, headers, SSE events or the JSON error) of one message in a new chat."""
    with live.client(token, replica) as client:
        chat = client.post("/v1/chats").json()["id"]
        run = ChatClient(client).send(chat, content, **body)
        return run.status, run.headers, run.error if run.status != 200 else run.events


def budget(live, user: str, tier: str) -> dict:
    with live.client(live.token("root", "pro", admin=True)) as admin:
        return admin.get(f"/v1/admin/users/{user}/budget", params={"tier": tier}).json()


def completions_of(live, runs: list[str]) -> dict[str, dict]:
    from topics import codec

    wanted = set(runs)
    found = read_topic(
        live.topic(RUN_COMPLETED), lambda m: codec.decode("RunCompleted", m.value())["prompt"]["run_id"] in wanted
    )
    return {r["prompt"]["run_id"]: r for r in (codec.decode("RunCompleted", m.value()) for m in found)}


def spent(records: dict[str, dict]) -> int:
    return sum(r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] for r in records.values())


def run_id(events) -> str:
    return events[0]["data"]["run_id"]


def test_over_budget_is_a_429_with_retry_after_before_any_stream_and_usage_shows_what_remains(live):
    user = f"budget-{uuid.uuid4().hex[:6]}"
    token = live.token(user, "free")
    set_limits(live, user, budget_tokens=300, refill_tokens_per_hour=0)

    status, headers, events = post(live, token, max_tokens=40)
    assert status == 200
    assert [e["event"] for e in events][:2] == ["run.queued", "run.started"]  # admitted, then served
    assert events[0]["data"]["pool"] == "small" and events[-1]["event"] == "run.completed"
    used = events[-1]["data"]["usage"]["prompt_tokens"] + events[-1]["data"]["usage"]["completion_tokens"]
    with live.client(token) as client:
        usage = wait_for(lambda: (u := client.get("/v1/usage").json())["budget"]["in_flight"] == 0 and u)
    assert usage["remaining_budget"] == 300 - used  # the estimate was charged, then settled to the actual

    status, headers, error = post(live, token, max_tokens=250)  # more than what remains
    assert status == 429 and headers["content-type"].startswith("application/json")
    assert error["error"]["code"] == "token_budget_exceeded" and error["error"]["type"] == "rate_limit_error"
    assert int(headers["retry-after"]) >= 1

    status, _, error = post(live, token, max_tokens=400)  # more than the whole budget: retrying cannot help
    assert status == 400 and error["error"]["code"] == "budget_too_small"

    set_limits(live, user, budget_tokens=100_000, refill_tokens_per_hour=100_000)  # at run time, no restart
    status, _, events = post(live, token, max_tokens=250)
    assert status == 200 and events[-1]["event"] == "run.completed"


def test_a_burst_from_one_user_over_both_replicas_keeps_the_concurrency_limit_and_the_budget_exactly(live):
    user = f"burst-{uuid.uuid4().hex[:6]}"
    token = live.token(user, "pro")
    set_limits(live, user, budget_tokens=3000, refill_tokens_per_hour=0, max_concurrent=3)

    with ThreadPoolExecutor(12) as pool:  # new chats: their prompts spread over both scheduler replicas
        results = list(
            pool.map(lambda i: post(live, token, i % 2, "Count from one to twenty.", max_tokens=48), range(12))
        )
    admitted = [run_id(r[2]) for r in results if r[0] == 200]
    refused = [r[2]["error"]["code"] for r in results if r[0] != 200]
    assert admitted and refused, results
    assert set(refused) == {"concurrency_limit_exceeded"}
    assert all(r[0] in (200, 429) for r in results)

    # Admitted runs overlapped at most 3 at a time (scheduled .. completed is inside admitted .. settled).
    from topics import codec

    # RunCompleted is published just after the stream's terminal event: wait until every one is in the log
    done = wait_for(lambda: (found := completions_of(live, admitted)) and len(found) == len(admitted) and found)
    assert done, "every admitted run completed"
    starts = {}
    for pool_topic in RUN_SCHEDULED.values():
        for msg in read_topic(live.topic(pool_topic), lambda m: True):
            record = codec.decode("RunScheduled", msg.value())
            if record["prompt"]["run_id"] in done:
                starts[record["prompt"]["run_id"]] = record["scheduled_at"] / 1000  # epoch ms, as every timestamp
    intervals = [(starts[r], done[r]["completed_at"] / 1000) for r in admitted]
    most = max(sum(1 for s, e in intervals if s <= t < e) for t, _ in intervals)
    assert most <= 3

    state = wait_for(lambda: (b := budget(live, user, "pro"))["in_flight"] == [] and b)
    assert state["remaining_budget"] == 3000 - spent(done)  # every admitted run charged once, settled once


def test_a_killed_scheduler_replica_loses_no_budget_state_and_redelivered_events_count_nothing_twice(live):
    user = f"restart-{uuid.uuid4().hex[:6]}"
    token = live.token(user, "pro")
    set_limits(live, user, budget_tokens=20_000, refill_tokens_per_hour=0, max_concurrent=32)
    scheduler = live.stack.pids()["scheduling"]

    with ThreadPoolExecutor(10) as pool:
        futures = [pool.submit(post, live, token, i % 2, "Name three colours.", max_tokens=24) for i in range(10)]
        time.sleep(0.3)
        os.kill(scheduler, signal.SIGKILL)  # mid-burst: some of its prompts are decided, some not yet
        results = [f.result() for f in futures]
    # Kept, never refused for the scheduler's sake: a prompt not decided in time streams `run.accepted` first.
    assert all(status == 200 and events[-1]["event"] == "run.completed" for status, _, events in results), results

    live.stack.start()  # the killed replica comes back
    live.stack.wait_ready()
    status, _, events = post(live, token, max_tokens=24)
    assert status == 200 and events[-1]["event"] == "run.completed"

    # Whatever each prompt's fate, the ledger holds exactly the usage of the runs it admitted.
    from topics import codec

    runs = {
        codec.decode("PromptModerated", m.value())["prompt"]["run_id"]: m
        for m in read_topic(
            live.topic(PROMPT_MODERATED),
            lambda m: codec.decode("PromptModerated", m.value())["prompt"]["user_id"] == user,
        )
    }
    done = wait_for(
        lambda: (
            len(d := completions_of(live, list(runs))) == len(runs)
            and budget(live, user, "pro")["in_flight"] == []
            and d
        ),
        timeout_s=90,
    )
    assert len(done) == len(runs) == 11
    assert budget(live, user, "pro")["remaining_budget"] == 20_000 - spent(done)

    # Forced redelivery: a prompt and a completion published again change nothing and run nothing again.
    again = run_id(events)
    producer = Producer({"bootstrap.servers": BOOTSTRAP})
    for topic, schema in ((PROMPT_MODERATED, "PromptModerated"), (RUN_COMPLETED, "RunCompleted")):
        for msg in read_topic(live.topic(topic), for_run(schema, again)):
            producer.produce(msg.topic(), value=msg.value(), key=msg.key())
    producer.flush(10)
    time.sleep(3)
    scheduled = [m for t in RUN_SCHEDULED.values() for m in read_topic(live.topic(t), for_run("RunScheduled", again))]
    assert len(scheduled) == 1
    assert budget(live, user, "pro")["remaining_budget"] == 20_000 - spent(done)


def test_a_request_the_scheduler_is_too_slow_to_decide_is_kept_and_answered_once(live):
    """Every scheduler replica is down: the edge does not refuse a prompt that is already in the log (a client
    retrying a 503 stored its question twice). Its stream starts with `run.accepted`, waits, and goes on with
    the answer once a scheduler is back; the chat holds the question once and its answer."""
    token = live.token()
    client = live.client(token)
    chat = client.post("/v1/chats").json()["id"]
    schedulers = {name: pid for name, pid in live.stack.pids().items() if name.startswith("scheduling")}
    assert len(schedulers) == 2
    for pid in schedulers.values():
        os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    restart = threading.Timer(15, live.stack.start)  # after the edge's 10 s wait for a decision
    restart.start()
    try:
        run = ChatClient(client).send(chat, "Say hi.", max_tokens=8)
        assert run.status == 200
        events = run.events
    finally:
        restart.join()
    live.stack.wait_ready()
    kinds = [e["event"] for e in events]
    assert kinds[0] == "run.accepted" and "id" not in events[0], kinds  # the edge's own event: no cursor
    assert kinds[1] == "run.queued" and kinds[-1] == "run.completed", kinds
    assert time.monotonic() - started >= 15
    messages = wait_for(lambda: len(m := client.get(f"/v1/chats/{chat}/messages").json()["data"]) >= 2 and m)
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[1]["finish_reason"] in ("stop", "length") and messages[1]["id"] == events[0]["data"]["run_id"]


def recognised_copies(live) -> float:
    """Runs the small pool's consumers recognised as already theirs: a copy dropped while the first was still
    held, or one whose ended answer was only published again (summed over the consumers)."""
    total = 0.0
    for service in live.stack.services():
        if not service.name.startswith("inference-small-"):
            continue
        for line in httpx.get(live.worker(service.name)[0], timeout=5).text.splitlines():
            if line.startswith("parley_inference_duplicates_dropped_total{") or (
                line.startswith("parley_inference_taken_over_total{") and 'state="ended"' in line
            ):
                total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_scheduler_dying_between_scheduling_a_run_and_recording_it_gets_the_run_served_once(live):
    """The window a redelivered prompt reopens: RunScheduled is in the log but the ledger does not say so. The
    run is scheduled again to the same pool partition, marked, and its consumer serves it only once."""
    user = f"twice-{uuid.uuid4().hex[:6]}"
    token = live.token(user, "pro")
    set_limits(live, user, budget_tokens=20_000, refill_tokens_per_hour=0)
    before = recognised_copies(live)
    (live.faults / "scheduling-after-publish").touch()
    status, _, events = post(live, token, content="Name three colours.", max_tokens=24)
    assert status == 200 and events[-1]["event"] == "run.completed"  # the first copy was served
    assert wait_for(lambda: not (live.faults / "scheduling-after-publish").exists(), 60), "no crash point reached"
    assert wait_for(lambda: len([n for n in live.stack.pids() if n.startswith("scheduling")]) == 1, 30)
    live.stack.start()  # it comes back and is given the prompt again
    live.stack.wait_ready()

    from topics import codec

    run = run_id(events)
    copies = wait_for(
        lambda: (
            len(found := read_topic(live.topic(RUN_SCHEDULED["small"]), for_run("RunScheduled", run))) == 2 and found
        ),
        timeout_s=60,
    )
    assert copies, "the redelivered prompt was not scheduled again"
    assert len({(m.topic(), m.partition()) for m in copies}) == 1  # where the first copy went
    assert [codec.decode("RunScheduled", m.value())["rescheduled"] for m in copies] == [False, True]
    assert wait_for(lambda: recognised_copies(live) > before, 60), "the consumer did not recognise the copy"

    completions = [
        codec.decode("RunCompleted", m.value())
        for m in read_topic(live.topic(RUN_COMPLETED), for_run("RunCompleted", run))
    ]
    assert len({c["event_id"] for c in completions}) == 1  # at most published again, as the same event
    assert len({json.dumps(c["usage"], sort_keys=True) for c in completions}) == 1
    deltas = [
        codec.decode("TokenDelta", m.value()) for m in read_topic(live.topic(TOKEN_DELTA), for_run("TokenDelta", run))
    ]
    generated = [d for d in deltas if d["kind"] in ("started", "delta")]
    assert len({d["seq"] for d in generated}) == len(generated)  # one generation: no seq written twice
    kinds = [d["kind"] for d in deltas]
    assert kinds.count("started") == 1 and kinds.count("queued") == 1  # the stream was told once
    state = wait_for(lambda: (b := budget(live, user, "pro"))["in_flight"] == [] and b)
    assert state["remaining_budget"] == 20_000 - spent({run: completions[0]})  # charged once, settled once


def test_under_pressure_free_runs_are_degraded_to_the_small_pool_or_refused_fast_with_retry_after(live):
    busy = f"busy-{uuid.uuid4().hex[:6]}"
    pro = live.token(busy, "pro")
    set_limits(live, busy, max_queue_wait_s=60.0)  # this user fills the large pool: it may queue there
    free_user, long_user = f"free-{uuid.uuid4().hex[:6]}", f"long-{uuid.uuid4().hex[:6]}"
    for user in (free_user, long_user):
        set_limits(live, user, max_queue_wait_s=0.0)  # any wait at all is too long for these two
    large = "smollm2-135m-instruct-8k"

    with live.client(pro) as client:  # fill the large pool (one consumer, two slots) and queue one more
        chats, long_runs = ChatClient(client), []
        try:
            story = "Tell a very long story about a dragon."
            for _ in range(3):
                chat = chats.new_chat()
                # its first event names the run; then hang up (a closed stream does not cancel: the run goes on)
                named = lambda r: r.run_id is not None  # noqa: E731
                run = chats.send(chat, story, max_tokens=400, model=large, when=named, then=lambda _: True)
                assert run.status == 200
                long_runs.append((chat, run.run_id))
            time.sleep(1.5)  # the large consumer's status now shows its slots taken

            status, _, events = post(live, live.token(free_user, "free"), model=large, max_tokens=16)
            assert status == 200
            # The scheduler's decision, whenever it comes: past the edge's admission wait (CI: a slow box) the
            # stream opens with the edge's own run.accepted and the decision follows it.
            queued = next((e["data"] for e in events if e["event"] == "run.queued"), None)
            assert queued is not None, events
            assert (queued["pool"], queued["degraded_from"]) == ("small", "large")
            started = next(e for e in events if e["event"] == "run.started")
            assert started["data"]["model"] == "smollm2-135m-instruct"  # the answer says which model served it

            # 2,536 tokens with SmolLM2's tokenizer and template: over the small pool's whole context (2,048), so
            # only the large pool holds it (150 sentences, 1,536 tokens, fits the small pool: the door shed it
            # only while it overestimated a message's size at a token per 3 characters)
            too_long = "Please summarise this. " + "The quick brown fox jumps over the lazy dog. " * 250
            status, headers, error = post(live, live.token(long_user, "free"), content=too_long, max_tokens=16)
            assert status == 429 and error["error"]["code"] == "over_capacity", error  # no smaller pool holds it
            assert int(headers["retry-after"]) >= 1
        finally:
            for chat, run in long_runs:  # stop the long runs
                client.post(f"/v1/chats/{chat}/runs/{run}/cancel")


def test_a_user_over_the_rate_limit_gets_a_429_saying_when_to_retry_on_every_replica(live):
    user = f"rate-{uuid.uuid4().hex[:6]}"
    set_limits(live, user, max_runs_per_minute=2)
    token = live.token(user)
    for replica in (0, 1):  # one window for the user, whichever replica takes the request
        status, _, _ = post(live, token, replica, max_tokens=2)
        assert status == 200
    status, headers, error = post(live, token, 1, max_tokens=2)
    assert status == 429 and error["error"]["code"] == "rate_limit_exceeded", error
    assert 1 <= int(headers["retry-after"]) <= 60
    completion = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    with live.client(token) as client:
        refused = client.post("/v1/chat/completions", json=completion)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert budget(live, user, "pro")["limits"]["max_runs_per_minute"] == 2
