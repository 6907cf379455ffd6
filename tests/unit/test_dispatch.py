"""The inference consumer's dispatch: which runs it starts, in which order, when background work may run and
which background runs a reply stops (inference/dispatch.py, pure: the times are given)."""

import asyncio

from admission.limits import BACKGROUND_PRIORITY
from inference.dispatch import Dispatch
from inference.run import Flight
from inference.settings import InferenceSettings

PRIORITY = {"enterprise": 30, "pro": 20, "free": 10}


def flight(run_id: str, tier: str = "pro", partition: int = 0, read_at: float = 0.0, background: bool = False):
    priority = BACKGROUND_PRIORITY if background else PRIORITY[tier]
    run = {"prompt": {"run_id": run_id, "tier": tier}, "priority": priority}
    return Flight(None, run, partition, maybe_started=False, read_at=read_at)  # type: ignore[arg-type]


def dispatch(slots: int = 2, caps: dict[str, int] | None = None, **settings) -> Dispatch:
    caps = caps or {}
    return Dispatch(InferenceSettings(slots=slots, **settings), lambda tier: caps.get(tier, slots))


def test_free_slots_go_to_the_highest_priority_first_then_first_come():
    d = dispatch(slots=2)
    for f in (flight("free-1", "free"), flight("pro-1", "pro"), flight("ent-1", "enterprise"), flight("pro-2")):
        assert d.admit(f)
    assert [f.run_id for f in d.next_runs(now=1.0)] == ["ent-1", "pro-1"]
    assert d.next_runs(now=1.0) == []  # every slot is taken
    assert d.running_now() == {"enterprise": 1, "pro": 1} and len(d) == 2


def test_a_run_that_waited_long_enough_overtakes_a_higher_tier_no_starvation():
    d = dispatch(slots=1, aging_s=10.0)
    d.admit(flight("free-old", "free", read_at=0.0))
    d.admit(flight("pro-new", "pro", read_at=99.0))
    # at t=100 the free run has aged 10 levels (10 + 100/10 = 20) and the pro run 0.1 (20.1): pro first
    assert [f.run_id for f in d.next_runs(now=100.0)] == ["pro-new"]
    d2 = dispatch(slots=1, aging_s=10.0)
    d2.admit(flight("free-old", "free", read_at=0.0))
    d2.admit(flight("pro-new", "pro", read_at=109.0))
    assert [f.run_id for f in d2.next_runs(now=110.0)] == ["free-old"]  # 10 + 11 = 21 > 20.1


def test_a_tier_holds_no_more_slots_than_its_share_and_the_rest_wait_for_other_tiers():
    d = dispatch(slots=4, caps={"free": 1})
    for i in range(3):
        d.admit(flight(f"free-{i}", "free"))
    started = d.next_runs(now=0.0)
    assert [f.run_id for f in started] == ["free-0"] and len(d) == 2
    d.admit(flight("pro-1"))
    assert [f.run_id for f in d.next_runs(now=0.0)] == ["pro-1"]
    d.ended(started[0], now=1.0, took_s=1.0)
    assert [f.run_id for f in d.next_runs(now=1.0)] == ["free-1"]  # the free slot is free again


def test_a_copy_of_a_run_held_here_is_refused():
    d = dispatch()
    assert d.admit(flight("r1")) and not d.admit(flight("r1"))
    assert len(d) == 1


def test_background_work_waits_for_a_quiet_engine_then_runs():
    d = dispatch(slots=2, background_idle_s=3.0, background_patience_s=60.0)
    reply = flight("reply")
    d.admit(reply)
    d.admit(flight("summary", background=True, read_at=0.0))
    assert [f.run_id for f in d.next_runs(now=0.0)] == ["reply"]  # a reply is running: the summary waits
    d.ended(reply, now=10.0, took_s=10.0)
    assert d.next_runs(now=11.0) == []  # a reply ended 1 s ago: not quiet yet
    assert [f.run_id for f in d.next_runs(now=13.0)] == ["summary"]


def test_background_work_past_its_patience_starts_beside_replies():
    d = dispatch(slots=2, background_idle_s=3.0, background_patience_s=60.0)
    d.admit(flight("reply"))
    d.admit(flight("summary", background=True, read_at=0.0))
    assert [f.run_id for f in d.next_runs(now=59.0)] == ["reply"]
    assert [f.run_id for f in d.next_runs(now=61.0)] == ["summary"]


def test_a_reply_preempts_running_background_work_that_still_yields():
    d = dispatch(slots=2, background_patience_s=60.0)
    summary, old = (flight("summary", background=True, read_at=0.0), flight("old", background=True, read_at=0.0))
    for f in (summary, old):
        d.admit(f)
    assert {f.run_id for f in d.next_runs(now=5.0)} == {"summary", "old"}
    summary.task = old.task = asyncio.Future  # started (any task object)
    old.stop.set()  # already stopping
    assert [f.run_id for f in d.to_preempt(now=10.0)] == ["summary"]
    assert d.to_preempt(now=61.0) == []  # past its patience it is not stopped


def test_partitions_leaving_drop_their_waiting_runs_and_name_their_running_ones():
    d = dispatch(slots=1)
    running, waiting, other = (flight("a", partition=3), flight("b", partition=3), flight("c", partition=4))
    d.admit(running)
    d.next_runs(now=0.0)
    d.admit(waiting)
    d.admit(other)
    dropped, stopping = d.leaving({3})
    assert [f.run_id for f in dropped] == ["b"] and [f.run_id for f in stopping] == ["a"]
    assert set(d.flights) == {"a", "c"} and len(d) == 1  # the running one stays held until its task ends
