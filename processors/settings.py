"""Settings of the processor deployables (one process per stage, any number of replicas)."""

from __future__ import annotations

from pathlib import Path

from conversation.settings import ContextSettings
from runtime.settings import state_dir


class ProcessorSettings(ContextSettings):
    web_port: int = 0  # faust's own web server (health, /metrics, metering's usage views); 0 = per stage default
    replica: int = 0  # which replica of its stage this process is (its own data folder)
    session_timeout_s: float = 10.0
    # A replica that held partitions stays ready (in its Service) through a rebalance of its group this long:
    # each KEDA step rebalances the whole group, and metering's pages answer throughout.
    rebalance_grace_s: float = 60.0
    # a run in flight longer than this no longer counts against its user's limit
    run_deadline_s: float = 300.0
    # metering (where usage is stored: runtime/settings.py, shared with the migration)
    meter_batch: int = 200
    meter_batch_s: float = 0.5
    price_table: str = ""  # a TOML price table (processors/prices.toml when empty)
    # tests only: a file named after a crash point in this folder makes the stage exit there
    faults_dir: str = ""

    def datadir(self, stage: str) -> Path:
        """faust's own data folder, one per replica (out of the source tree)."""
        path = state_dir() / "faust" / (self.namespace or "default") / f"{stage}-{self.replica}"
        path.mkdir(parents=True, exist_ok=True)
        return path
