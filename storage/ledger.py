"""Token budgets in Cassandra: one partition per user, changed only by compare-and-set (lightweight transactions).

Every scheduler replica admits and settles runs of any user against the same rows, so a budget holds across
replicas and restarts: there is no state in the stage to lose. A user's partition has the bucket in static
columns (the tokens used and not yet refilled, when that was written, a version every write bumps, the runs
in flight) and one row per run admitted (its estimate, and once settled its actual tokens). Each write is one
conditional batch on `version`: two replicas admitting runs of one user at once serialise, and a redelivered
event finds its run's row and changes nothing (docs/decisions/0006-admission-control.md).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

from cassandra.cluster import Session
from cassandra.query import BatchStatement
from prometheus_client import Counter

from admission.limits import Limits
from storage.session import check_writer, create_tables, idempotent, wait
from topics.clock import now_ms

log = logging.getLogger(__name__)

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS {ks}.budgets (
    user_id text, run_id text,
    used double static, refilled_at bigint static, version bigint static, in_flight map<text, bigint> static,
    started frozen<list<bigint>> static,
    estimate int, actual int, settled boolean, scheduled boolean, decided_at bigint, pool text, pool_partition int,
    PRIMARY KEY ((user_id), run_id))""",
)
COLUMNS_ADDED = (
    ("budgets", "pool", "text"),
    ("budgets", "pool_partition", "int"),
    # when the user's runs of the last minute were admitted (ms); frozen: one cell, rewritten without tombstones
    ("budgets", "started", "frozen<list<bigint>> static"),
)
RATE_WINDOW_MS = 60_000
RUN_ROW_TTL_S = 7 * 24 * 3600  # how long a run's row stays to recognise a redelivered event


@dataclass
class Account:
    """A user's bucket as stored: what they used that has not refilled yet (a user never seen used nothing).

    Storing the usage rather than the balance lets an admin's new budget apply at once, up or down."""

    used: float = 0.0
    refilled_at: int = 0  # ms, when `used` was written
    version: int | None = None
    in_flight: dict[str, int] = field(default_factory=dict)  # run id -> admitted at (ms)
    # admissions of the last minute (ms), for the rate limit
    started: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Decision:
    admitted: bool
    # when not admitted: token_budget_exceeded | concurrency_limit_exceeded | rate_limit_exceeded | budget_too_small
    code: str = ""
    message: str = ""
    retry_after_s: int | None = None
    scheduled: bool = False  # admitted before and already handed to its pool (a redelivered event)
    # admitted before: where it was placed (None for a row written before this was kept)
    pool: str | None = None
    partition: int | None = None
    decided_at: int | None = None  # ms


def outstanding(account: Account, limits: Limits, now_ms: int) -> float:
    """Tokens used and not refilled yet: the stored usage less the refill since it was written (pure)."""
    refill = limits.refill_tokens_per_hour * max(0, now_ms - account.refilled_at) / 3_600_000
    return max(0.0, account.used - refill)


def available(account: Account, limits: Limits, now_ms: int) -> float:
    """Tokens the user can spend now (pure)."""
    return max(0.0, limits.budget_tokens - outstanding(account, limits, now_ms))


def live_runs(account: Account, now_ms: int, deadline_ms: int) -> dict[str, int]:
    """Runs in flight, less any older than the run deadline (their completion was lost: they free the slot)."""
    return {run: at for run, at in account.in_flight.items() if now_ms - at < deadline_ms}


def recent_starts(account: Account, limits: Limits, now_ms: int) -> list[int]:
    """The admissions that count against the rate limit now: those of the last minute, at most as many as the
    limit (pure; none kept without a limit)."""
    if limits.max_runs_per_minute <= 0:
        return []
    window = sorted(t for t in account.started if now_ms - t < RATE_WINDOW_MS)
    return window[-limits.max_runs_per_minute :]


def decide(
    account: Account, limits: Limits, estimate: int, now_ms: int, deadline_ms: int
) -> Decision:
    """Admit a run costing `estimate` tokens, or say why not and when to retry (pure)."""
    if estimate > limits.budget_tokens:
        return Decision(
            False,
            "budget_too_small",
            f"This request could use up to {estimate} tokens, more than your budget of {limits.budget_tokens}. "
            "Ask for a shorter answer (max_tokens) or start a new chat.",
        )
    running = live_runs(account, now_ms, deadline_ms)
    if len(running) >= limits.max_concurrent:
        return Decision(
            False,
            "concurrency_limit_exceeded",
            f"You have {len(running)} requests in progress, the most your plan allows at once. Wait for one to finish.",
            retry_after_s=2,
        )
    started = recent_starts(account, limits, now_ms)
    if limits.max_runs_per_minute > 0 and len(started) >= limits.max_runs_per_minute:
        wait_s = math.ceil((started[0] + RATE_WINDOW_MS - now_ms) / 1000)
        return Decision(
            False,
            "rate_limit_exceeded",
            f"You started {len(started)} requests in the last minute, the most your plan allows.",
            retry_after_s=max(1, wait_s),
        )
    have = available(account, limits, now_ms)
    if have < estimate:
        rate = limits.refill_tokens_per_hour / 3600
        wait_s = math.ceil((estimate - have) / rate) if rate > 0 else 3600
        return Decision(
            False,
            "token_budget_exceeded",
            f"This request could use up to {estimate} tokens and {int(have)} remain in your budget.",
            retry_after_s=max(1, wait_s),
        )
    return Decision(True)


def recorded(row: Any) -> Decision:
    """An admission as its run's row holds it."""
    scheduled = bool(row.scheduled)
    return Decision(
        True,
        scheduled=scheduled,
        pool=row.pool,
        partition=row.pool_partition,
        decided_at=row.decided_at,
    )


ERRORS = Counter(
    "parley_ledger_errors_total",
    "Budget-ledger operations that failed (the caller retries them; a steady rate means admissions are stalled)",
    ["operation", "error"],
)
P = ParamSpec("P")
R = TypeVar("R")


def counted(
    operation: Callable[Concatenate[Ledger, P], Awaitable[R]],
) -> Callable[Concatenate[Ledger, P], Awaitable[R]]:
    """Count an operation's failures by their kind, then let them go on to the caller."""

    @functools.wraps(operation)
    async def wrapper(self: Ledger, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await operation(self, *args, **kwargs)
        except Exception as exc:
            ERRORS.labels(operation.__name__, type(exc).__name__).inc()
            raise

    return wrapper


def create_schema(session: Session, keyspace: str) -> None:
    """The budgets table: the migration's work (storage/schema.py)."""
    create_tables(session, keyspace, SCHEMA, COLUMNS_ADDED)


class Ledger:
    """Written by the scheduling stage alone (WRITERS, as in storage/session.py Store); the edge reads a
    user's standing from it."""

    WRITERS = {"budgets": "scheduling"}

    def __init__(
        self, session: Session, keyspace: str, writer: str, run_deadline_s: float = 300.0
    ) -> None:
        self.session = session
        self.writer = writer
        self.deadline_ms = int(run_deadline_s * 1000)
        ks = keyspace
        p = idempotent(
            session
        )  # all but the compare-and-set batch's statements: run twice, it would conflict
        self._account = p(
            f"SELECT used, refilled_at, version, in_flight, started FROM {ks}.budgets WHERE user_id = ? LIMIT 1"
        )
        self._run = p(
            f"SELECT estimate, settled, scheduled, pool, pool_partition, decided_at FROM {ks}.budgets "
            "WHERE user_id = ? AND run_id = ?"
        )
        self._scheduled = p(
            f"UPDATE {ks}.budgets USING TTL {RUN_ROW_TTL_S} SET scheduled = true WHERE user_id = ? AND run_id = ?"
        )
        self._set_bucket = session.prepare(
            f"UPDATE {ks}.budgets SET used = ?, refilled_at = ?, version = ?, in_flight = ?, started = ? "
            "WHERE user_id = ? IF version = ?"
        )
        self._insert_run = session.prepare(
            f"INSERT INTO {ks}.budgets (user_id, run_id, estimate, settled, decided_at, pool, pool_partition) "
            "VALUES (?, ?, ?, false, ?, ?, ?) "
            f"USING TTL {RUN_ROW_TTL_S}"
        )
        self._settle_run = session.prepare(
            f"UPDATE {ks}.budgets USING TTL {RUN_ROW_TTL_S} SET actual = ?, settled = true "
            "WHERE user_id = ? AND run_id = ?"
        )

    def _writing(self) -> None:
        check_writer(self.WRITERS, "budgets", self.writer)

    @counted
    async def account(self, user_id: str) -> Account:
        row = (await wait(self.session.execute_async(self._account, (user_id,)))).one()
        if row is None or row.version is None:
            return Account()
        return Account(
            row.used or 0.0,
            row.refilled_at or 0,
            row.version,
            dict(row.in_flight or {}),
            list(row.started or []),
        )

    @counted
    async def standing(self, user_id: str, limits: Limits) -> tuple[int, list[str]]:
        """(tokens the user can spend now, their runs in flight)."""
        account = await self.account(user_id)
        now = now_ms()
        return int(available(account, limits, now)), sorted(
            live_runs(account, now, self.deadline_ms)
        )

    async def _run_row(self, user_id: str, run_id: str) -> Any:
        return (await wait(self.session.execute_async(self._run, (user_id, run_id)))).one()

    async def _write(
        self,
        user_id: str,
        before: Account,
        used: float,
        in_flight: dict[str, int],
        started: list[int],
        now_ms: int,
        run: tuple[Any, tuple[Any, ...]],
    ) -> bool:
        self._writing()
        batch = BatchStatement()
        version = (before.version or 0) + 1
        bucket = (used, now_ms, version, in_flight, started, user_id, before.version)
        batch.add(self._set_bucket, bucket)
        batch.add(*run)
        result = (await wait(self.session.execute_async(batch))).one()
        return bool(result[0])

    @counted
    async def look(self, user_id: str, run_id: str) -> tuple[Account, Decision | None]:
        """The user's account and the decision recorded for the run, if any, in one round trip."""
        account, row = await asyncio.gather(self.account(user_id), self._run_row(user_id, run_id))
        return account, None if row is None else recorded(row)

    @counted
    async def admit(
        self,
        user_id: str,
        run_id: str,
        estimate: int,
        limits: Limits,
        pool: str,
        partition: int | None,
        known: Account | None = None,
    ) -> Decision:
        """Charge the run's estimate and count it in flight, or refuse; a run already admitted stays admitted.
        The placement (pool and partition) is kept with it, so a run scheduled again after a crash goes where
        the first copy went and its consumer recognises it. `known`: the account as `look` just read it, with no
        decision for the run; the first compare-and-set uses it (one round trip less), a conflict reads again."""
        for attempt in range(50):
            if attempt == 0 and known is not None:
                account, row = known, None
            else:
                account, row = await asyncio.gather(
                    self.account(user_id), self._run_row(user_id, run_id)
                )
            if row is not None:
                return recorded(row)  # decided before (redelivered): charged once
            now = now_ms()
            decision = decide(account, limits, estimate, now, self.deadline_ms)
            if not decision.admitted:
                return decision
            used = outstanding(account, limits, now) + estimate
            in_flight = {**live_runs(account, now, self.deadline_ms), run_id: now}
            started = (
                [*recent_starts(account, limits, now), now] if limits.max_runs_per_minute else []
            )
            insert = (self._insert_run, (user_id, run_id, estimate, now, pool, partition))
            if await self._write(user_id, account, used, in_flight, started, now, insert):
                return decision
            await asyncio.sleep(
                0.002 * (attempt + 1)
            )  # another replica wrote this user's bucket first
        raise TimeoutError(f"budget of {user_id} is contended; giving up for now")

    @counted
    async def mark_scheduled(self, user_id: str, run_id: str) -> None:
        """The run was handed to its pool: a redelivered prompt is not scheduled (served) a second time."""
        self._writing()
        await wait(self.session.execute_async(self._scheduled, (user_id, run_id)))

    @counted
    async def settle(self, user_id: str, run_id: str, actual: int, limits: Limits) -> bool:
        """Replace the run's estimate with its actual tokens and free its slot; False when there was nothing to
        settle (a run never charged here, or one settled before)."""
        for attempt in range(50):
            account, row = await asyncio.gather(
                self.account(user_id), self._run_row(user_id, run_id)
            )
            if row is None or row.settled:
                return False
            now = now_ms()
            used = max(0.0, outstanding(account, limits, now) - (row.estimate or 0) + actual)
            in_flight = {
                r: at for r, at in live_runs(account, now, self.deadline_ms).items() if r != run_id
            }
            update = (self._settle_run, (actual, user_id, run_id))
            started = recent_starts(account, limits, now)
            if await self._write(user_id, account, used, in_flight, started, now, update):
                return True
            await asyncio.sleep(0.002 * (attempt + 1))
        raise TimeoutError(f"budget of {user_id} is contended; giving up for now")
