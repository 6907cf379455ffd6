"""Settings of the processor deployables (one process per stage, any number of replicas)."""

from __future__ import annotations

from pathlib import Path

from topics.settings import StackSettings, state_dir


class ProcessorSettings(StackSettings):
    web_port: int = 0  # faust's own web server (health, /metrics, metering's usage views); 0 = per stage default
    replica: int = 0  # which replica of its stage this process is (its own data folder)
    session_timeout_s: float = 10.0
    # scheduling
    recent_messages: int = 160  # the most messages after the summary read for the verbatim window
    system_prompt: str = "You are Parley, a helpful assistant. Answer clearly and concisely."
    prev_turn_wait_s: float = 3.0  # how long to wait for the previous answer to be persisted before going on
    run_deadline_s: float = 300.0  # a run in flight longer than this no longer counts against its user's limit
    # memory (docs/decisions/0008-conversation-memory.md); the budgets are per pool (topics/settings.py Pool)
    summary_tokens: int = 256  # the most a summary may take in a prompt
    recall_tokens: int = 320  # reserved in a prompt for retrieved messages (at most a fifth of the budget)
    recall_item_tokens: int = 120  # the most one retrieved message may take
    recall_k: int = 6  # the most messages recalled per new message (the reserve's tokens bound them too)
    recall_candidates: int = 16  # nearest messages read from the vector index, from which recall chooses
    recall_min_similarity: float = 0.35  # cosine below this is not relevant enough to spend tokens on
    recall_diversity: float = 0.4  # MMR: 1 ranks by relevance alone; lower prefers messages unlike those chosen
    memory_pool: str = "small"  # the pool summaries run on
    summarize_after_tokens: int = 768  # unsummarised tokens after the summary that start a new one
    summarize_keep_tokens: int = 256  # the newest tokens a summary leaves out (the verbatim window keeps them)
    summary_max_tokens: int = 160  # a summary run's answer
    summary_timeout_s: float = 180.0  # a summary run not back by then is tried again
    # metering (where usage is stored: topics/settings.py, shared with the migration)
    meter_batch: int = 200
    meter_batch_s: float = 0.5
    price_table: str = ""  # a TOML price table (processors/prices.toml when empty)
    faults_dir: str = ""  # tests only: a file named after a crash point in this folder makes the stage exit there

    def datadir(self, stage: str) -> Path:
        """faust's own data folder, one per replica (out of the source tree)."""
        path = state_dir() / "faust" / (self.namespace or "default") / f"{stage}-{self.replica}"
        path.mkdir(parents=True, exist_ok=True)
        return path


STAGE_PORTS = {"moderation": 6066, "scheduling": 6067, "persistence": 6068, "metering": 6069, "memory": 6070}
