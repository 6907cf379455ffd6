"""The edge's wait for the scheduler's decision (api/runs.admitted): a request whose prompt is in the log is
kept, never refused for the scheduler's or the log's sake."""

import asyncio
import json
from types import SimpleNamespace

import pytest

from api import convert, runs, streams
from api.replies import ACCEPTED, Reply


def deps(wait_s: float) -> SimpleNamespace:
    """The edge's services as `admitted` uses them; `decided` records the runs the door stopped counting."""
    settings = SimpleNamespace(admission_timeout_s=wait_s)
    decided: list[str] = []
    return SimpleNamespace(
        settings=settings,
        replies=SimpleNamespace(close=lambda run_id: None),
        pools=SimpleNamespace(decided=decided.append),
        decided=decided,
    )


EVENT = {"run_id": "r1", "chat_id": "c1", "user_id": "u1", "model": None}


async def test_a_run_whose_first_record_times_out_is_kept_and_its_stream_ends_with_the_timeout():
    async def replies():
        raise streams.StreamTimeout("No progress on this run.")
        yield  # an async generator

    first, rest = await runs.admitted(deps(5.0), EVENT, replies(), stream_refusals=True)
    assert first.kind == ACCEPTED  # not a 500 from the route, as before
    with pytest.raises(streams.StreamTimeout):
        await anext(rest)


async def test_a_slow_decision_streams_accepted_then_the_decision():
    async def replies():
        await asyncio.sleep(0.2)
        yield Reply("t:0:0", "queued", {"run_id": "r1"})
        yield Reply("t:0:1", "completed", {"run_id": "r1"})

    edge = deps(0.05)
    first, rest = await runs.admitted(edge, EVENT, replies(), stream_refusals=True)
    assert first.kind == ACCEPTED
    assert edge.decided == ["r1"]  # kept past the wait: the door counts it no longer (its placement will show)
    assert [r.kind async for r in rest] == ["queued", "completed"]


def test_a_refusal_after_the_stream_started_ends_it_as_an_error_with_its_retry_after():
    prompt = {"run_id": "r1", "chat_id": "c1"}
    later = {"prompt": prompt, "code": "over_capacity", "message": "busy", "category": None, "retry_after_s": 4}
    event = convert.sse(Reply("r:0:7", "rejected", later))
    assert event["event"] == "error" and event["id"] == "r:0:7"
    assert json.loads(event["data"]) == {"run_id": "r1", "code": "over_capacity", "message": "busy", "retry_after_s": 4}
    final = convert.sse(Reply("r:0:8", "rejected", dict(later, code="budget_too_small", retry_after_s=None)))
    assert "retry_after_s" not in json.loads(final["data"])  # retrying cannot help: no time is given


async def test_a_queued_record_is_shown_once_even_when_it_lands_after_the_run_started():
    """The scheduler sends `queued` beside the run itself (processors/schedule_run.py): one before the start is
    shown, a second one is dropped; a lone one that lands after the engine's first record is still shown, since
    it names the pool the run was degraded to (CI at 882a68c lost one that way)."""
    from api.streams import sse_stream

    run = {"run_id": "r1", "chat_id": "c1", "model": "m"}
    queued = {**run, "pool": "small", "estimated_wait_ms": 0, "degraded_from": None}
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "cached_tokens": 0}

    async def replies():
        yield Reply("", ACCEPTED, run)
        yield Reply("t:0:1", "queued", queued)
        yield Reply("t:0:2", "started", run)
        yield Reply("t:0:3", "delta", {**run, "text": "Hi"})
        yield Reply("t:0:4", "queued", queued)  # late: after the start
        yield Reply("t:0:5", "completed", {**run, "usage": usage, "finish_reason": "stop"})

    events = [e["event"] async for e in sse_stream(deps(5.0), "r1", replies(), live=False)]
    assert events == ["run.accepted", "run.queued", "run.started", "token", "run.completed"]

    async def late():
        yield Reply("t:0:1", "started", run)
        yield Reply("t:0:2", "delta", {**run, "text": "Hi"})
        yield Reply("t:0:3", "queued", {**queued, "pool": "small", "degraded_from": "large"})
        yield Reply("t:0:4", "completed", {**run, "usage": usage, "finish_reason": "stop"})

    shown = [e async for e in sse_stream(deps(5.0), "r1", late(), live=False)]
    assert [e["event"] for e in shown] == ["run.started", "token", "run.queued", "run.completed"]
    assert json.loads(shown[2]["data"])["degraded_from"] == "large"


async def test_a_keepalive_while_the_prompt_is_prefilled_is_not_shown():
    """The consumer publishes an empty delta while a long prompt is prefilled (inference/run.py): it only keeps
    the edge's no-progress timeout from cutting the run, and the client sees no empty token."""
    from api.streams import sse_stream

    run = {"run_id": "r1", "chat_id": "c1", "model": "m"}
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "cached_tokens": 0}

    async def replies():
        yield Reply("t:0:1", "started", run)
        yield Reply("t:0:2", "delta", {**run, "text": ""})
        yield Reply("t:0:3", "delta", {**run, "text": ""})
        yield Reply("t:0:4", "delta", {**run, "text": "Hi"})
        yield Reply("t:0:5", "completed", {**run, "usage": usage, "finish_reason": "stop"})

    events = [e async for e in sse_stream(deps(5.0), "r1", replies(), live=False)]
    assert [e["event"] for e in events] == ["run.started", "token", "run.completed"]
    assert json.loads(events[1]["data"])["delta"] == "Hi" and events[1]["id"] == "t:0:4"
