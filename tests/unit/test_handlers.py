"""The moderation, persistence and metering stages' handlers, called as the stage calls them, with in-memory
stores and log (tests/unit/fakes.py); their real stores and Kafka are tested under tests/stack/."""

import uuid

from processors import meter_usage, moderate_prompt, persist_turn
from processors.meter_usage import Prices
from safety.moderator import Verdict
from safety.policy import BUILTIN, Decision
from storage.ids import new_id
from storage.withdrawals import WITHDRAWN
from tests.unit.fakes import (
    FakeConversations,
    FakeDecisions,
    FakeLog,
    FakeUsage,
    completed,
    decoded,
    prompt,
    rejected,
    run,
)
from topics.clock import now_ms
from topics.pipeline import FEEDBACK, MEMORY_CHANGED, PROMPT_MODERATED

# -- moderation -----------------------------------------------------------------------------------------------


class FakeModerator:
    def __init__(self, verdict):
        self.verdict = verdict
        self.asked = []

    async def check_async(self, policy, stage, texts):
        self.asked.append((policy.version, stage, list(texts)))
        return self.verdict


class FakePolicies:
    def for_tier(self, tier):
        return BUILTIN


def test_moderation_publishes_the_verdict_keyed_by_the_chat():
    blocked = Verdict(Decision("block", "harmful_request", 0.99), {"harmful_request": 0.99}, BUILTIN.version, 4.0)
    log, moderator = FakeLog(), FakeModerator(blocked)
    p = prompt(content="how do I make a bomb")
    run(moderate_prompt.on_prompt(p, moderate_prompt.Deps(log, moderator, FakePolicies())))
    assert moderator.asked == [(BUILTIN.version, "input", ["how do I make a bomb"])]
    [sent] = log.on(PROMPT_MODERATED)
    assert sent.key == p["chat_id"]
    assert sent.record["decision"] == "blocked" and sent.record["category"] == "harmful_request"
    assert sent.record["prompt"] == p


def test_moderation_checks_every_turn_the_client_wrote_on_the_openai_route_but_not_its_system_turn():
    allowed = Verdict(Decision(None, None, None), {}, BUILTIN.version, 1.0)
    moderator = FakeModerator(allowed)
    turns = [{"role": "system", "content": "Be a pirate."}, {"role": "user", "content": "Hi"}]
    run(moderate_prompt.on_prompt(prompt(messages=turns), moderate_prompt.Deps(FakeLog(), moderator, FakePolicies())))
    assert moderator.asked[0][2] == ["Hi"]


# -- persistence ----------------------------------------------------------------------------------------------


def persistence():
    return persist_turn.Deps(FakeConversations(), FakeDecisions())


def test_a_turn_is_stored_as_the_question_then_the_answer_and_a_redelivery_changes_nothing():
    deps = persistence()
    chat = deps.conversations.add_chat()
    p = prompt(chat)
    done = completed(p)
    for _ in range(2):
        run(persist_turn.on_prompt(p, deps))
        run(persist_turn.on_completed(done, deps))
    stored = deps.conversations.messages[chat]
    assert [(m.role, m.content) for m in stored.values()] == [("user", "Hello there"), ("assistant", "Bonjour")]
    assert stored[p["run_id"]].finish_reason == "stop" and stored[p["run_id"]].pool == "small"


def test_nothing_is_stored_for_a_stateless_run_or_a_deleted_chat():
    deps = persistence()
    run(persist_turn.on_prompt(prompt(store=False), deps))
    run(persist_turn.on_completed(completed(prompt()), deps))  # its chat is not there (deleted)
    assert deps.conversations.messages == {}


def test_a_refusal_is_stored_as_the_answer_and_a_withdrawn_question_is_removed():
    deps = persistence()
    chat = deps.conversations.add_chat()
    refused, withdrawn = prompt(chat), prompt(chat)
    for p in (refused, withdrawn):
        run(persist_turn.on_prompt(p, deps))
    run(persist_turn.on_rejected(rejected(refused), deps))
    run(persist_turn.on_rejected(rejected(withdrawn, WITHDRAWN, "Not served."), deps))
    stored = deps.conversations.messages[chat]
    assert set(stored) == {refused["message_id"], refused["run_id"]}
    assert stored[refused["run_id"]].finish_reason == "token_budget_exceeded"


def test_a_question_whose_run_the_edge_withdrew_before_it_arrived_is_not_kept():
    deps = persistence()
    chat = deps.conversations.add_chat()
    p = prompt(chat)  # published a minute ago: long enough for the edge to have given up on it
    deps.conversations.fates[(p["chat_id"], p["run_id"])] = WITHDRAWN
    run(persist_turn.on_prompt(p, deps))
    assert deps.conversations.messages[chat] == {}


def test_feedback_is_kept_on_a_stored_answer_and_dropped_for_one_that_is_gone():
    deps = persistence()
    chat = deps.conversations.add_chat()
    p = prompt(chat)
    run(persist_turn.on_completed(completed(p), deps))
    for message_id, rating in ((p["run_id"], "up"), (str(new_id()), "down"), (p["run_id"], "none")):
        feedback = {"event_id": "f", "chat_id": str(chat), "user_id": "u", "message_id": message_id, "rating": rating}
        feedback["at"] = now_ms()
        run(persist_turn.on_feedback(decoded(FEEDBACK, feedback), deps))
    assert deps.conversations.feedback == {p["run_id"]: None}  # up, then taken back; the unknown one dropped


def test_a_deleted_chats_messages_are_erased():
    deps = persistence()
    chat = deps.conversations.add_chat()
    run(persist_turn.on_completed(completed(prompt(chat)), deps))
    del deps.conversations.chats[chat]  # the edge deletes the row, then tells
    change = {"event_id": "c", "chat_id": str(chat), "user_id": "u", "action": "chat_deleted", "at": now_ms()}
    run(persist_turn.on_changed(decoded(MEMORY_CHANGED, change), deps))
    assert chat not in deps.conversations.messages


def test_only_a_moderation_that_matched_a_rule_goes_to_the_review_list():
    deps = persistence()
    p = prompt(content="x" * 500)
    moderated = {
        "event_id": str(uuid.uuid4()),
        "prompt": p,
        "decision": "blocked",
        "category": "toxic",
        "scores": {"toxic": 0.99},
        "action": "block",
        "policy_version": "v",
        "moderated_at": now_ms(),
    }
    run(
        persist_turn.on_moderated(decoded(PROMPT_MODERATED, {**moderated, "action": None, "decision": "allowed"}), deps)
    )
    run(persist_turn.on_moderated(decoded(PROMPT_MODERATED, moderated), deps))
    [row] = deps.decisions.rows
    assert (row.action, row.category, row.score, len(row.excerpt)) == ("block", "toxic", 0.99, 300)


# -- metering -------------------------------------------------------------------------------------------------


class FakeIndex:
    """What the stage hands the search index (the index itself: tests/unit/test_search.py)."""

    def __init__(self):
        self.rows = []

    def write(self, rows):
        self.rows += rows
        return len(rows)


def metering(crashes=None):
    prices = Prices({"smollm2-135m-instruct": {"prompt": 1.0, "cached": 0.5, "completion": 2.0}})
    crashed = (crashes if crashes is not None else []).append
    return meter_usage.Deps(FakeUsage(), prices, crashed, FakeIndex())


def test_a_batch_is_one_priced_row_per_run_and_a_redelivered_batch_adds_none():
    crashes = []
    deps = metering(crashes)
    done = completed(prompt())
    run(meter_usage.on_completed([done], deps))
    # the question and the answer are made searchable
    assert [(r["role"], r["content"]) for r in deps.index.rows] == [
        ("user", done["prompt"]["content"]),
        ("assistant", done["content"]),
    ]
    run(meter_usage.on_completed([done], deps))
    [row] = deps.store.rows.values()
    # 600 uncached prompt tokens at $1/M, 400 cached at $0.5/M, 200 completion at $2/M
    assert row["cost_usd"] == "0.001200000" and row["kind"] == "chat"
    assert crashes == ["metering-after-write"] * 2  # the crash point sits between the write and the commit


def test_a_rejected_run_is_a_row_with_nothing_served():
    deps = metering()
    refused = rejected(prompt(), "content_filter")
    run(meter_usage.on_rejected([refused], deps))
    assert [r["role"] for r in deps.index.rows] == ["user"]  # the question stays in its chat
    [row] = deps.store.rows.values()
    assert row["finish_reason"] == "rejected:content_filter" and row["moderation"] == "refused:policy"
    assert row["prompt_tokens"] == row["completion_tokens"] == 0
