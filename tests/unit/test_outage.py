"""A dependency that is down is logged once per outage, then once a minute, not once per failure."""

import logging

from runtime import outage
from runtime.outage import Outage


def test_an_outage_is_logged_once_then_once_a_minute_and_a_new_one_again(monkeypatch, caplog):
    now = [1000.0]
    monkeypatch.setattr(outage.time, "monotonic", lambda: now[0])
    down = Outage(logging.getLogger("t"), "Cassandra", every_s=60, quiet_s=30)
    with caplog.at_level(logging.WARNING, "t"):
        for _ in range(200):  # 200 failed requests in 50 s: one line
            down.failed("NoHostAvailable")
            now[0] += 0.25
        assert [r.getMessage() for r in caplog.records] == ["Cassandra is unavailable: NoHostAvailable"]
        for _ in range(100):  # it goes on past a minute: one summary with the count
            down.failed("NoHostAvailable")
            now[0] += 0.25
        assert len(caplog.records) == 2
        assert caplog.records[1].getMessage().startswith("Cassandra still unavailable after 60s: 240 more failures")
        now[0] += 120  # it came back; a later failure is a new outage, said at once
        down.failed("OperationTimedOut")
        assert caplog.records[-1].getMessage() == "Cassandra is unavailable: OperationTimedOut"
