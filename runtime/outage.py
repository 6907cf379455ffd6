"""Logs that say what is down once per outage, not a line (or a traceback) per request or retry.

The first failure of a dependency is logged at once; while failures go on, one line a minute says how many
there were and the latest; a failure after `quiet_s` without any counts as a new outage. Thread-safe: the
edge's request handlers and the Kafka client threads report into the same one.
"""

from __future__ import annotations

import logging
import threading
import time


class Outage:
    def __init__(
        self, log: logging.Logger, what: str, every_s: float = 60.0, quiet_s: float = 30.0
    ) -> None:
        self.log, self.what, self.every_s, self.quiet_s = log, what, every_s, quiet_s
        self._lock = threading.Lock()
        self._began = self._said = self._last = 0.0
        self._since_said = 0

    def failed(self, detail: str) -> None:
        now = time.monotonic()
        with self._lock:
            if not self._began or now - self._last > self.quiet_s:
                self._began = self._said = self._last = now
                self._since_said = 0
                self.log.warning("%s is unavailable: %s", self.what, detail)
                return
            self._last = now
            self._since_said += 1
            if now - self._said < self.every_s:
                return
            count, self._since_said, self._said = self._since_said, 0, now
        self.log.warning(
            "%s still unavailable after %.0fs: %d more failures; the latest: %s",
            self.what,
            now - self._began,
            count,
            detail,
        )
