"""Admission control's pure parts: token buckets, concurrency, bounded-queue estimates, degradation, priority."""

from admission.limits import DEFAULT_TIERS, Limits, effective, tier_cap
from admission.placement import (
    EngineLoad,
    at_the_door,
    count_undecided,
    estimated_wait,
    home_partition,
    place,
    pool_loads,
)
from admission.slots import RunQueue
from runtime.settings import DEFAULT_POOLS
from storage.ledger import Account, available, decide, live_runs, recent_starts

FREE, PRO = DEFAULT_TIERS["free"], DEFAULT_TIERS["pro"]
TIERS = dict(DEFAULT_TIERS)
PARTS = {"small": 4, "large": 4}  # partitions of each pool's scheduled-runs topic
HOUR_MS = 3_600_000


def limits(**changes) -> Limits:
    return FREE.model_copy(update=changes)


def test_a_new_user_has_a_full_bucket_and_it_refills_at_the_tier_rate_up_to_its_size():
    lim = limits(budget_tokens=1000, refill_tokens_per_hour=3600)  # one token a second
    assert available(Account(), lim, 0) == 1000
    spent = Account(used=900.0, refilled_at=0, version=3)
    assert available(spent, lim, 10_000) == 110  # 10 s later
    assert available(spent, lim, 10 * HOUR_MS) == 1000  # never above the bucket
    assert available(spent, limits(budget_tokens=5000, refill_tokens_per_hour=0), 0) == 4100  # a raise applies now


def test_a_run_is_admitted_only_while_the_budget_covers_its_whole_estimate():
    lim = limits(budget_tokens=1000, refill_tokens_per_hour=3600)
    assert decide(Account(used=500.0, refilled_at=0, version=1), lim, 500, 0, 300_000).admitted
    short = decide(Account(used=501.0, refilled_at=0, version=1), lim, 500, 0, 300_000)
    assert not short.admitted and short.code == "token_budget_exceeded"
    assert short.retry_after_s == 1  # one token short at a token a second
    too_big = decide(Account(), lim, 1001, 0, 300_000)
    assert not too_big.admitted and too_big.code == "budget_too_small" and too_big.retry_after_s is None


def test_runs_in_flight_are_limited_per_user_and_a_lost_completion_frees_its_slot_after_the_deadline():
    lim = limits(max_concurrent=2)
    busy = Account(used=0.0, refilled_at=0, version=1, in_flight={"a": 0, "b": 1000})
    refused = decide(busy, lim, 10, 2000, 300_000)
    assert not refused.admitted and refused.code == "concurrency_limit_exceeded" and refused.retry_after_s
    assert live_runs(busy, 300_500, 300_000) == {"b": 1000}  # "a" outlived the run deadline
    assert decide(busy, lim, 10, 300_500, 300_000).admitted


def test_a_user_starts_at_most_the_rate_limit_of_runs_in_any_minute_and_is_told_when_to_retry():
    lim = DEFAULT_TIERS["pro"].model_copy(update={"max_runs_per_minute": 3})
    at = [1_000, 20_000, 50_000]
    full = Account(version=1, started=at)
    refused = decide(full, lim, 10, 59_000, 300_000)
    assert (refused.admitted, refused.code) == (False, "rate_limit_exceeded")
    assert refused.retry_after_s == 2, "the oldest of the three leaves the window at 61 s"
    assert decide(full, lim, 10, 61_000, 300_000).admitted
    assert recent_starts(full, lim, 61_000) == [20_000, 50_000]
    unlimited = lim.model_copy(update={"max_runs_per_minute": 0})
    assert decide(full, unlimited, 10, 59_000, 300_000).admitted and recent_starts(full, unlimited, 0) == []
    assert DEFAULT_TIERS["free"].max_runs_per_minute == 30 and DEFAULT_TIERS["pro"].max_runs_per_minute == 0


def test_limits_are_defaults_then_the_tier_row_then_the_user_row():
    rows = {
        "tier:pro": {"max_concurrent": 9, "budget_tokens": None},
        "user:ann": {"budget_tokens": 123, "max_concurrent": None},
    }
    assert effective(rows, "bob", "pro").max_concurrent == 9
    assert effective(rows, "bob", "pro").budget_tokens == PRO.budget_tokens
    ann = effective(rows, "ann", "pro")
    assert (ann.budget_tokens, ann.max_concurrent, ann.priority) == (123, 9, PRO.priority)


def status(pool, running, queued, slots=8, at=10_000, healthy=True, mean=2.0, partitions=(0,)):
    return {
        "worker_id": f"w{at}{pool}",
        "pool": pool,
        "slots": slots,
        "healthy": healthy,
        "running": running,
        "queued": queued,
        "mean_run_s": mean,
        "at": at,
        "partitions": list(partitions),
    }


def engine(running, queued, slots=8, mean=2.0, partitions=(0, 1, 2, 3)):
    return EngineLoad(slots=slots, partitions=partitions, running=running, queued=queued, mean_run_s=mean)


def chat_at_home(pool, partition):
    """A chat id whose home partition in `pool` is `partition`."""
    return next(c for c in (f"chat-{i}" for i in range(10_000)) if home_partition(c, PARTS[pool]) == partition)


def test_pool_load_counts_only_fresh_healthy_consumers_engine_by_engine():
    loads = pool_loads(
        [
            status("small", {"pro": 2}, {}),
            status("small", {"free": 1}, {"free": 3}, at=10_001, partitions=(1, 2)),
            status("small", {"pro": 8}, {}, at=1_000),
            status("large", {}, {}, healthy=False),
        ],
        now_ms=11_000,
    )
    assert set(loads) == {"small"} and len(loads["small"]) == 2
    assert [e.partitions for e in loads["small"]] == [(0,), (1, 2)]
    assert loads["small"][1].running == {"free": 1} and loads["small"][1].queued == {"free": 3}


def test_free_runs_wait_once_they_hold_their_share_while_pro_runs_still_start_at_once():
    load = engine({"free": 4}, {"free": 2})
    assert estimated_wait(load, "pro", TIERS) == 0.0  # 4 slots free, and the waiting free runs are behind it
    # free may hold half of the 8 slots: it holds them all, so it waits behind the 2 queued free runs
    assert estimated_wait(load, "free", TIERS) == 3 * 2.0 / 4


def test_a_run_goes_home_while_its_engine_has_room_else_to_the_engine_that_can_start_it_soonest():
    busy = engine({"pro": 8}, {"pro": 2}, partitions=(0, 2))  # 0.75 s of queue
    idle = engine({"pro": 3}, {}, partitions=(1, 3))
    even, odd = chat_at_home("small", 2), chat_at_home("small", 3)
    assert place("small", [], {"small": [busy, idle]}, odd, "pro", TIERS, PARTS).partition == 3
    moved = place("small", [], {"small": [busy, idle]}, even, "pro", TIERS, PARTS)
    assert moved.pool == "small" and moved.partition in idle.partitions and moved.wait_s == 0.0
    full = engine({"pro": 8}, {"pro": 2}, partitions=idle.partitions)
    refused = place("small", [], {"small": [busy, full]}, even, "pro", TIERS, PARTS)
    assert refused.pool is None and refused.retry_after_s >= 1  # the pool's free slot total says nothing here
    assert place("small", [], {}, even, "pro", TIERS, PARTS).partition == 2  # no status yet: not judged, goes home


def test_over_its_bound_a_free_run_is_degraded_to_a_smaller_pool_and_a_pro_run_is_refused_with_retry_after():
    busy = engine({"pro": 2}, {"pro": 6}, slots=2, mean=4.0)
    idle = engine({}, {}, mean=1.0)
    loads = {"large": [busy], "small": [idle]}
    free_run = place("large", ["small"], loads, "c1", "free", TIERS, PARTS)
    assert (free_run.pool, free_run.degraded_from) == ("small", "large")
    assert free_run.partition == home_partition("c1", PARTS["small"])
    pro_run = place("large", ["small"], loads, "c1", "pro", TIERS, PARTS)
    assert pro_run.pool is None and pro_run.retry_after_s and pro_run.retry_after_s >= 1


def test_the_edge_sheds_only_what_no_pool_the_run_could_reach_has_room_for():
    full = engine({"pro": 8}, {"pro": 4}, mean=4.0)  # 2.5 s of queue
    idle = engine({}, {}, slots=2, mean=4.0)

    def door(model, least, may_grow, loads, tier):
        return at_the_door(model, least, may_grow, DEFAULT_POOLS, "small", loads, tier, TIERS)

    shed = door(None, 100, False, {"small": [full], "large": [idle]}, "pro")
    assert shed is not None and shed.pool is None and shed.retry_after_s >= 1
    assert place("small", [], {"small": [full], "large": [idle]}, "c1", "pro", TIERS, PARTS).pool is None  # agreed
    assert door(None, 100, False, {"small": [full, idle]}, "pro") is None  # one engine of the pool has room
    assert door(None, 100, True, {"small": [full], "large": [idle]}, "pro") is None  # history may need large
    assert door(None, 3000, False, {"small": [full], "large": [idle]}, "pro") is None  # too long for small
    assert door("smollm2-135m-instruct-8k", 100, False, {"small": [idle], "large": [full]}, "free") is None
    assert door("smollm2-135m-instruct-8k", 100, False, {"small": [idle], "large": [full]}, "pro") is not None
    assert door(None, 100, False, {"large": [idle]}, "pro") is None  # no status from small yet: not judged
    assert door(None, 9000, False, {"small": [full], "large": [full]}, "pro") is None  # fits nowhere: the 400
    # is the scheduler's


def test_the_queue_serves_higher_priority_first_and_ages_so_a_free_run_is_not_starved():
    queue: RunQueue[str] = RunQueue(aging_s=10.0)
    queue.push("free-1", "free", 0, now=0.0)
    queue.push("pro-1", "pro", 1, now=1.0)
    queue.push("pro-2", "pro", 1, now=2.0)
    anyone = lambda tier: True  # noqa: E731
    assert queue.pop(3.0, anyone) == "pro-1"
    assert queue.pop(3.0, anyone) == "pro-2"
    queue.push("pro-3", "pro", 1, now=12.0)
    assert queue.pop(12.5, anyone) == "free-1"  # waited 12.5 s: worth more than a fresh pro run
    assert queue.pop(12.5, lambda tier: tier != "pro") is None  # a tier over its share waits
    assert queue.by_tier() == {"pro": 1}


def test_tier_caps_leave_slots_for_higher_tiers():
    assert tier_cap(8, 0.5) == 4 and tier_cap(8, 1.0) == 8 and tier_cap(1, 0.5) == 1


def test_background_runs_wait_while_a_reply_needs_the_engine():
    queue: RunQueue[str] = RunQueue(aging_s=10.0)
    queue.push("summary", "pro", -100, 0.0)
    queue.push("reply", "free", 0, 1.0)
    replies_busy = {"on": True}

    def eligible(item: str) -> bool:
        return item != "summary" or not replies_busy["on"]

    assert queue.pop(2.0, lambda tier: True, eligible) == "reply"
    assert queue.pop(2.0, lambda tier: True, eligible) is None  # a reply is running: the summary waits
    replies_busy["on"] = False
    assert queue.pop(2.0, lambda tier: True, eligible) == "summary"


def scheduled_run(pool="large", tier="free", chat="c1", estimate=500):
    prompt = {"run_id": "r1", "chat_id": chat, "tier": tier, "user_id": "u1", "model": None}
    model = DEFAULT_POOLS[pool].model
    return {"prompt": prompt, "pool": pool, "model": model, "estimate_tokens": estimate, "degraded_from": None}


def test_the_scheduler_places_a_run_under_pressure_on_a_smaller_pool_with_that_pools_model_and_tier_priority():
    from processors.schedule_run import Refusal, place_run
    from processors.settings import ProcessorSettings

    settings = ProcessorSettings()
    loads = {"large": [engine({"pro": 2}, {"pro": 6}, slots=2, mean=4.0)], "small": [engine({}, {}, mean=1.0)]}
    run = scheduled_run()
    run_now, placement = place_run(run, None, TIERS, loads, PARTS, settings)
    assert (run_now["pool"], run_now["degraded_from"]) == ("small", "large")
    assert run_now["model"] == DEFAULT_POOLS["small"].model and run_now["priority"] == FREE.priority
    assert placement.partition == home_partition("c1", PARTS["small"])
    assert run["pool"] == "large" and "priority" not in run  # the given run is left as it was
    refused = place_run(scheduled_run(tier="pro"), None, TIERS, loads, PARTS, settings)
    assert isinstance(refused, Refusal) and refused.code == "over_capacity" and refused.retry_after_s >= 1
    too_big = scheduled_run(estimate=DEFAULT_POOLS["small"].context + 1)  # no smaller pool holds it
    assert isinstance(place_run(too_big, None, TIERS, loads, PARTS, settings), Refusal)


def test_a_run_admitted_before_a_crash_goes_where_it_went_whatever_the_load_now():
    from processors.schedule_run import place_run
    from processors.settings import ProcessorSettings
    from storage.ledger import Decision

    full = {"large": [engine({"pro": 2}, {"pro": 60}, slots=2, mean=4.0)], "small": []}
    before = Decision(admitted=True, pool="large", partition=3, decided_at=1)
    run, placement = place_run(scheduled_run(tier="pro"), before, TIERS, full, PARTS, ProcessorSettings())
    assert (placement.pool, placement.partition, run["pool"], run["rescheduled"]) == ("large", 3, "large", True)
    # an older ledger row without the pool: its home partition in the run's own pool
    legacy = Decision(admitted=True, decided_at=1)
    run, placement = place_run(scheduled_run(tier="pro"), legacy, TIERS, full, PARTS, ProcessorSettings())
    assert (placement.pool, placement.partition) == ("large", home_partition("c1", PARTS["large"]))


def test_the_door_counts_what_it_let_through_until_decided_so_a_burst_is_shed_at_once_but_not_a_pro_user():
    """63 free requests arrive within a millisecond, before any status or placement shows them: each one the
    door lets through counts as waiting until the scheduler's decision comes back, so the door sheds the rest
    of the burst itself instead of passing them all to be refused seconds later; a pro request still passes
    (free runs do not wait ahead of it)."""

    def loads():
        return {"small": [engine({}, {}, slots=2, mean=4.0)], "large": [engine({}, {}, slots=1, mean=8.0)]}

    def door(tier, undecided):
        current = loads()
        count_undecided(current, undecided)
        return at_the_door(None, 100, False, DEFAULT_POOLS, "small", current, tier, TIERS)

    undecided: list[tuple[str, str]] = []
    passed = 0
    for _ in range(63):
        if door("free", undecided) is None:
            undecided.append(("small", "free"))
            passed += 1
    assert 1 <= passed < 10  # let through while the small pool's queue holds them within free's bound
    assert door("free", undecided) is not None  # the rest of the burst: 429 at the door
    assert door("pro", undecided) is None  # a pro user is not behind them
    assert door("free", []) is None  # once decided (placed or refused), they count no more here
