"""Admission control's pure parts: token buckets, concurrency, bounded-queue estimates, degradation, priority."""

from inference.queue import RunQueue, tier_cap
from processors.admission import PoolLoad, estimated_wait, place, pool_loads
from storage.ledger import Account, available, decide, live_runs
from topics.limits import DEFAULT_TIERS, Limits, effective

FREE, PRO = DEFAULT_TIERS["free"], DEFAULT_TIERS["pro"]
TIERS = dict(DEFAULT_TIERS)
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


def test_limits_are_defaults_then_the_tier_row_then_the_user_row():
    rows = {
        "tier:pro": {"max_concurrent": 9, "budget_tokens": None},
        "user:ann": {"budget_tokens": 123, "max_concurrent": None},
    }
    assert effective(rows, "bob", "pro").max_concurrent == 9
    assert effective(rows, "bob", "pro").budget_tokens == PRO.budget_tokens
    ann = effective(rows, "ann", "pro")
    assert (ann.budget_tokens, ann.max_concurrent, ann.priority) == (123, 9, PRO.priority)


def status(pool, running, queued, slots=8, at=10_000, healthy=True, mean=2.0):
    return {"worker_id": f"w{at}{pool}", "pool": pool, "slots": slots, "healthy": healthy, "running": running,
            "queued": queued, "mean_run_s": mean, "at": at}


def test_pool_load_counts_only_fresh_healthy_consumers():
    loads = pool_loads(
        [status("small", {"pro": 2}, {}), status("small", {"free": 1}, {"free": 3}, at=10_001),
         status("small", {"pro": 8}, {}, at=1_000), status("large", {}, {}, healthy=False)],
        now_ms=11_000,
    )
    assert set(loads) == {"small"}
    assert loads["small"].slots == 16 and loads["small"].running == {"pro": 2, "free": 1}
    assert loads["small"].queued == {"free": 3}


def test_free_runs_wait_once_they_hold_their_share_while_pro_runs_still_start_at_once():
    load = PoolLoad(worker_slots=[8], running={"free": 4}, queued={"free": 2}, mean_run_s=2.0)
    assert estimated_wait(load, "pro", TIERS) == 0.0  # 4 slots free, and the waiting free runs are behind it
    # free may hold half of the 8 slots: it holds them all, so it waits behind the 2 queued free runs
    assert estimated_wait(load, "free", TIERS) == 3 * 2.0 / 4


def test_over_its_bound_a_free_run_is_degraded_to_a_smaller_pool_and_a_pro_run_is_refused_with_retry_after():
    busy = PoolLoad(worker_slots=[2], running={"pro": 2}, queued={"pro": 6}, mean_run_s=4.0)
    idle = PoolLoad(worker_slots=[8], running={}, queued={}, mean_run_s=1.0)
    loads = {"large": busy, "small": idle}
    free_run = place("large", ["small"], loads, "free", TIERS)
    assert (free_run.pool, free_run.degraded_from) == ("small", "large")
    tight = {**TIERS, "pro": PRO.model_copy(update={"max_queue_wait_s": 1.0})}
    pro_run = place("large", ["small"], loads, "pro", tight)
    assert pro_run.pool is None and pro_run.retry_after_s and pro_run.retry_after_s >= 1
    assert place("large", [], {}, "pro", TIERS).pool == "large"  # no status yet: not judged


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
