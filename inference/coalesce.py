"""Coalescing token deltas into records: a few ms or a few tokens per record, never one per character."""

from __future__ import annotations

import time


class Coalescer:
    """Buffers text; says when to flush. The first token goes out at once so TTFT is not padded."""

    def __init__(self, interval_s: float = 0.02, max_chars: int = 64) -> None:
        self.interval_s = interval_s
        self.max_chars = max_chars
        self._buffer: list[str] = []
        self._size = 0
        self._last_flush: float | None = None

    def add(self, text: str, now: float | None = None) -> str | None:
        """Add text; returns what to publish now, or None to keep buffering."""
        if text:
            self._buffer.append(text)
            self._size += len(text)
        now = time.perf_counter() if now is None else now
        due = (
            self._last_flush is None
            or now - self._last_flush >= self.interval_s
            or self._size >= self.max_chars
        )
        if self._size and due:
            self._last_flush = now
            return self.drain()
        return None

    def drain(self) -> str:
        text = "".join(self._buffer)
        self._buffer.clear()
        self._size = 0
        return text
