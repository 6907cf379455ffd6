"""The one clock of the events: epoch milliseconds, the unit of every timestamp on a topic."""

from __future__ import annotations

import time


def now_ms() -> int:
    return int(time.time() * 1000)
