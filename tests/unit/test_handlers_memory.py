"""The memory stage's handlers with in-memory stores, encoder and log (tests/unit/fakes.py); the real vector
index, summaries on the engine and the races between edits and completions are tested in tests/stack/."""

import uuid
from datetime import timedelta

from conversation import summary, tokens
from processors import remember
from processors.settings import ProcessorSettings
from storage.ids import new_id
from storage.memory import Summary
from storage.rows import Change, Message
from tests.unit.edge_fakes import FakeDocuments
from tests.unit.fakes import FakeConversations, FakeEncoder, FakeLog, FakeMemory, at, completed, decoded, prompt, run
from topics.clock import now_ms
from topics.pipeline import MEMORY_CHANGED, RUN_SCHEDULED

SETTINGS = ProcessorSettings(summarize_after_tokens=60, summarize_keep_tokens=20)


def memory_stage():
    counter = tokens.load(SETTINGS.pools[SETTINGS.memory_pool].tokenizer)
    deps = remember.Deps(
        FakeLog(), FakeConversations(), FakeMemory(), FakeEncoder(), SETTINGS, counter, FakeDocuments()
    )
    deps.partitions.append(4)  # the summary pool topic's partitions, as read from the cluster
    return deps


def turn(deps, chat, question="My name is Ada and I live in Lyon.", answer="Nice to meet you, Ada."):
    p = prompt(chat, content=question)
    done = completed(p, content=answer)
    for message in (
        Message(p["message_id"], "user", question, at(p["created_at"])),
        Message(p["run_id"], "assistant", answer, at(done["completed_at"]), p["run_id"]),
    ):
        run(deps.conversations.put_message(chat, message))
    return p, done


def changed(chat, action, message_id=None, content=None, role=None):
    record = {
        "event_id": str(uuid.uuid4()),
        "chat_id": str(chat),
        "user_id": "u",
        "action": action,
        "message_id": message_id,
        "role": role,
        "content": content,
        "at": now_ms(),
    }
    return decoded(MEMORY_CHANGED, record)


def test_a_turn_is_embedded_as_the_user_left_it():
    deps = memory_stage()
    chat = deps.conversations.add_chat()
    p, done = turn(deps, chat)
    deps.conversations.edits[chat] = {p["message_id"]: Change("My name is Ada.", at(now_ms()))}
    run(remember.on_completed(done, deps))
    stored = deps.memory.vectors[chat]
    assert stored[p["message_id"]][:2] == ("user", "My name is Ada.")
    assert stored[p["run_id"]][:2] == ("assistant", "Nice to meet you, Ada.")
    assert deps.publish.sent == []  # a short chat is not summarised yet


def test_stateless_runs_and_deleted_chats_are_not_remembered():
    deps = memory_stage()
    run(remember.on_completed(completed(prompt(store=False)), deps))
    run(remember.on_completed(completed(prompt()), deps))  # its chat is gone
    assert deps.memory.vectors == {}


def test_a_chat_past_its_threshold_asks_for_one_summary_run_on_the_memory_pool():
    deps = memory_stage()
    chat = deps.conversations.add_chat()
    for _ in range(4):
        p, done = turn(deps, chat)
    run(remember.on_completed(done, deps))
    run(remember.on_completed(done, deps))  # one summary run per chat at a time
    [asked] = deps.publish.on(RUN_SCHEDULED[SETTINGS.memory_pool])
    run_ = asked.record
    assert asked.key == str(chat) and run_["priority"] == remember.SUMMARY_PRIORITY
    assert run_["prompt"]["store"] is False and run_["prompt"]["summary"]["version"] == 1
    assert run_["messages"][-1]["content"].endswith(summary.INSTRUCTION)
    assert "Ada" in run_["messages"][-1]["content"]
    assert run_["prompt"]["summary"]["messages"] % 2 == 0  # whole turns: it ends on an answer


def summary_done(deps, chat, finish_reason="stop"):
    for _ in range(4):
        p, done = turn(deps, chat)
    run(remember.on_completed(done, deps))
    [asked] = deps.publish.on(RUN_SCHEDULED[SETTINGS.memory_pool])
    return completed(asked.record["prompt"], content="The user is Ada, from Lyon.", finish_reason=finish_reason)


def test_a_finished_summary_run_is_stored_as_the_next_version():
    deps = memory_stage()
    chat = deps.conversations.add_chat()
    run(remember.on_completed(summary_done(deps, chat), deps))
    [stored] = deps.memory.summaries[chat]
    assert (stored.version, stored.content) == (1, "The user is Ada, from Lyon.")


def test_a_summary_begun_before_the_user_changed_the_chat_is_discarded():
    deps = memory_stage()
    chat = deps.conversations.add_chat()
    done = summary_done(deps, chat)
    deps.conversations.chats[chat].memory_changed_at = at(now_ms()) + timedelta(seconds=1)
    assert remember.discarded(done, deps.conversations.chats[chat], None) == remember.CHANGED
    run(remember.on_completed(done, deps))
    assert deps.memory.summaries.get(chat, []) == []


def test_discarded_says_why_a_summary_is_not_stored():
    deps = memory_stage()
    chat = deps.conversations.add_chat()
    done = summary_done(deps, chat, finish_reason="error")
    row = deps.conversations.chats[chat]
    assert remember.discarded(done, None, None) == "the chat is gone"
    assert remember.discarded(done, row, None).startswith("the run ended error")
    newer = Summary(3, str(new_id()), "newer", 5, "r")
    assert remember.discarded({**done, "finish_reason": "stop"}, row, newer) == "the newest summary is now v3"
    assert remember.discarded({**done, "finish_reason": "stop"}, row, None) is None


def test_edits_deletes_and_resets_change_what_is_remembered():
    deps = memory_stage()
    chat = deps.conversations.add_chat()
    p, done = turn(deps, chat)
    run(remember.on_completed(done, deps))
    run(remember.on_changed(changed(chat, "edited", p["message_id"], "I am Grace.", "user"), deps))
    assert deps.memory.vectors[chat][p["message_id"]][:2] == ("user", "I am Grace.")
    run(remember.on_changed(changed(chat, "deleted", p["run_id"]), deps))
    assert set(deps.memory.vectors[chat]) == {p["message_id"]}
    run(remember.on_changed(changed(chat, "reset"), deps))
    assert chat not in deps.memory.vectors and deps.memory.resets == [chat]
