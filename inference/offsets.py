"""Which offset is safe to commit when runs finish out of order (pure)."""

from __future__ import annotations


class OffsetTracker:
    """Per partition: commit up to (not including) the oldest run still in flight.

    Runs of one partition finish in any order under continuous batching; committing the oldest unfinished
    offset means a crash replays only runs that had not completed, never skips one.
    """

    def __init__(self) -> None:
        self._in_flight: dict[int, set[int]] = {}
        self._highest: dict[int, int] = {}

    def started(self, partition: int, offset: int) -> None:
        self._in_flight.setdefault(partition, set()).add(offset)
        self._highest[partition] = max(self._highest.get(partition, -1), offset)

    def finished(self, partition: int, offset: int) -> int:
        """Mark a run done; returns the offset to commit for its partition (the next one to read)."""
        pending = self._in_flight.get(partition, set())
        pending.discard(offset)
        return min(pending) if pending else self._highest[partition] + 1

    def in_flight(self) -> int:
        return sum(len(s) for s in self._in_flight.values())

    def forget(self, partitions: list[int]) -> None:
        for p in partitions:
            self._in_flight.pop(p, None)
            self._highest.pop(p, None)
