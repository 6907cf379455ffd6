"""Which prompts a stage fences against the edge's withdrawal (storage/withdrawals.py): only a chat run's prompt
read at least half the producer's delivery timeout after it was published."""

from runtime.kafka import DELIVERY_TIMEOUT_MS, producer_config
from storage.withdrawals import SUSPECT_AFTER_MS, suspect


def prompt(created_at: int, **extra) -> dict:
    return {"created_at": created_at, "store": True, "messages": None, **extra}


def test_a_late_chat_prompt_is_suspect_and_a_fresh_one_is_not():
    now = 1_000_000
    assert not suspect(prompt(now - 2_000), now)
    assert not suspect(prompt(now - SUSPECT_AFTER_MS + 1), now)
    assert suspect(prompt(now - SUSPECT_AFTER_MS), now)
    assert suspect(prompt(now - 10 * DELIVERY_TIMEOUT_MS), now)  # a replay of old traffic, too


def test_a_stateless_run_has_no_run_to_withdraw():
    now = 1_000_000
    assert not suspect(prompt(now - DELIVERY_TIMEOUT_MS, store=False), now)
    assert not suspect(prompt(now - DELIVERY_TIMEOUT_MS, messages=[{"role": "user", "content": "hi"}]), now)


def test_the_edge_is_back_on_a_restarted_broker_well_within_the_suspect_window():
    """A record the log delivers to a stage is acknowledged to the edge after at most a reconnect backoff and a
    retry backoff (a second each): far less than the half timeout a prompt must wait to be suspect."""
    config = producer_config("localhost:9092")
    assert config["reconnect.backoff.max.ms"] + config.get("retry.backoff.max.ms", 1000) < SUSPECT_AFTER_MS / 5
