"""Prompt assembly within a budget, with the serving model's own tokenizer (pure: no services)."""

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from conversation import tokens
from conversation.context import Limits, TooLong, Turn, assemble_chat, costs, window
from conversation.gather import as_changed, current_summary
from conversation.summary import fold
from processors.settings import ProcessorSettings
from runtime.settings import DEFAULT_POOLS
from storage.ids import new_id
from storage.memory import Recalled, Summary
from storage.rows import Change, Message

SYSTEM = ProcessorSettings().system_prompt


@pytest.fixture(scope="module")
def tok():
    return tokens.load(DEFAULT_POOLS["small"].tokenizer)


def turns(n, words=40):
    out = []
    for i in range(n):
        out.append(Turn(str(new_id()), "user", f"Question {i}: " + "tell me about the harbour " * (words // 5)))
        out.append(Turn(str(new_id()), "assistant", f"Answer {i}: " + "the harbour is calm today " * (words // 5)))
    return out


def test_the_tokenizer_counts_the_chat_template_and_special_tokens(tok):
    one = [{"role": "user", "content": "hello"}]
    # <|im_start|>system\n...<|im_end|>\n (the template's default system) + <|im_start|>user\nhello<|im_end|>\n
    # + <|im_start|>assistant\n: the same count llama-server reports (tests/stack/test_memory.py checks it)
    assert tok.count_chat(one) == 31
    assert tok.count("<|im_start|>") == 1 and tok.count("12345") == 5  # special token; digits one by one
    assert tok.truncate("one two three four", 2) == "one two"


def test_a_growing_conversation_never_exceeds_the_budget_and_flattens(tok):
    limits = Limits(budget=1536)  # the small pool's; turns of ~100 tokens
    counts, moves, previous = [], 0, None
    history = turns(120)
    for n in range(0, len(history), 2):
        done = assemble_chat(SYSTEM, None, history[:n], False, None, "What now?", limits, tok)
        assert done.record["prompt_tokens"] == tok.count_chat(done.messages) <= limits.budget
        counts.append(done.record["prompt_tokens"])
        dropped = history[: n - len(done.record["verbatim_ids"])]  # the pool choice reads the largest of these
        assert done.largest_dropped == max(costs(dropped, tok), default=0)
        if previous is not None and done.messages[: len(previous) - 1] != previous[:-1]:
            moves += 1  # the window's start moved: the engine's cached prefix ends after the system prompt
        previous = done.messages
    tail = counts[len(counts) // 2 :]
    assert counts[-1] > counts[0] and max(counts) <= limits.budget
    assert min(tail) >= limits.budget // 3  # flat: a band under the budget, not growing with the chat
    assert 0 < moves <= len(counts) // 4  # the window moves in blocks, not at every turn


def test_the_window_keeps_the_newest_whole_turns_starting_with_a_user_turn(tok):
    history = turns(10)
    kept = history[window(history, costs(history, tok), 300) :]
    assert kept and kept[-1] == history[-1] and kept[0].role == "user"
    assert history[-len(kept) :] == kept


def test_the_prefix_is_stable_from_turn_to_turn(tok):
    """Between summaries the prompt only grows at its end: the previous prompt, less its new message, is a
    prefix of the next one (what engine prefix caching needs)."""
    limits = Limits(budget=1536)
    history = turns(4)
    summary = (3, str(new_id()), "The user is planning a trip to Lisbon in May.")
    first = assemble_chat(SYSTEM, summary, history[:-2], True, [], "Next?", limits, tok)
    second = assemble_chat(SYSTEM, summary, history, True, [], "And then?", limits, tok)
    assert second.messages[: len(first.messages) - 1] == first.messages[:-1]
    assert "Lisbon" in second.messages[0]["content"] and second.record["summary_version"] == 3


def test_recalled_messages_go_before_the_new_message_in_time_order(tok):
    limits = Limits(budget=1536)
    old = turns(3)
    recalled = [old[4], old[0]]  # best first
    done = assemble_chat(SYSTEM, None, turns(2), True, recalled, "Remind me?", limits, tok)
    last = done.messages[-1]["content"]
    assert last.endswith("Remind me?") and last.index("Question 0") < last.index("Question 2")
    assert done.record["retrieved_ids"] == [old[0].id, old[4].id]
    assert done.record["prompt_tokens"] <= limits.budget


def test_a_message_that_cannot_fit_is_refused(tok):
    with pytest.raises(TooLong):
        assemble_chat(SYSTEM, None, [], False, None, "word " * 2000, Limits(budget=500), tok)


def test_summaries_fold_the_oldest_whole_turns_and_keep_the_newest():
    msgs = [Message(str(new_id()), role, "x", None) for role in ["user", "assistant"] * 6]  # type: ignore[arg-type]
    counts = [100] * 12
    assert fold(msgs, counts, 1500, 300, 4000) == 0  # not over the trigger yet
    n = fold(msgs, counts, 768, 300, 4000)
    assert n == 8 and msgs[n - 1].role == "assistant"  # the 3 newest fit in 300; the cut moves back to a turn end
    # A backlog (summaries that could not run for a while) is folded in pieces a summary run's prompt holds:
    # 150 messages at once had overflowed the small model's context, and the run failed.
    backlog = [Message(str(new_id()), role, "x", None) for role in ["user", "assistant"] * 75]  # type: ignore[arg-type]
    n = fold(backlog, [100] * 150, 768, 256, 976)
    assert n == 8 and backlog[n - 1].role == "assistant"
    assert fold(backlog, [5000] + [100] * 149, 768, 256, 976) == 6  # cut to 300 tokens: 300 + 6 x 100 fits


def test_recall_takes_the_fact_over_earlier_questions_and_repeated_wrong_answers():
    """What the 200-turn bench's probe at turn 140 saw: the nearest neighbours of a question about a fact
    are the earlier questions about it and the model's (wrong) answers to them, one of them twice."""
    from conversation.context import relevant
    from safety.encoder import Encoder

    fact = "My sister Ana lives in Porto and works as a marine biologist."
    wrong = "Your sister Ana lives in a small village in Asia, where it's called Malaysia."
    texts = [
        "Where does my sister live?",
        wrong,
        wrong,
        "Where does my sister live? I forgot.",
        fact,
        "Tell me something interesting about volcanoes.",
    ]
    encoder = Encoder()
    query = encoder.embed(["Remind me, which city is my sister in?"])[0]
    vectors = encoder.embed(texts)
    by_relevance = sorted(range(len(texts)), key=lambda i: -float(vectors[i] @ query))
    assert by_relevance.index(4) >= 3  # nearest-first with k=3 would miss the fact
    picked = relevant(query, texts, vectors, k=3, floor=0.35, weight=0.4)
    assert 4 in picked
    assert len({texts[i] for i in picked}) == len(picked)  # a repeated text counts once
    assert 5 not in relevant(query, texts, vectors, k=6, floor=0.35, weight=0.4)  # unrelated: below the floor
    assert relevant(query, [], vectors[:0], k=3, floor=0.35, weight=0.4) == []


def test_a_turned_away_question_and_its_notice_stay_out_of_the_prompt():
    from conversation.gather import conversation_turns

    def msg(role, run, content, model="smollm2"):
        return Message(str(new_id()), role, content, None, run, model if role == "assistant" else None)  # type: ignore[arg-type]

    rows = [
        msg("user", "r1", "Hi"),
        msg("assistant", "r1", "Hello!"),
        msg("user", "r2", "Say hello."),
        msg("assistant", "r2", "You have 1 requests in progress ...", model=None),  # a 429 the scheduler stored
        msg("user", "r3", "Say hello."),
        msg("assistant", "r3", ""),  # an answer with no text
    ]
    now = new_id().time
    assert [(t.role, t.content) for t in conversation_turns(rows, now)] == [
        ("user", "Hi"),
        ("assistant", "Hello!"),
        ("user", "Say hello."),
    ]
    assert [t.id for t in conversation_turns(rows, uuid.UUID(rows[2].id).time)] == [rows[0].id, rows[1].id]


def test_a_summary_an_edit_made_wrong_is_passed_over_until_a_newer_one_is_written():

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    ids = [uuid.uuid1() for _ in range(6)]
    older = Summary(1, str(ids[1]), "up to 1", 5, "r1", t0)
    newer = Summary(2, str(ids[3]), "up to 3", 5, "r2", t0 + timedelta(seconds=5))
    newest_first = [newer, older]
    assert current_summary(newest_first, {}) is newer
    edit_of_2 = {str(ids[2]): Change("edited", t0 + timedelta(seconds=9))}
    assert current_summary(newest_first, edit_of_2) is older  # 2 is covered by v2 only
    delete_of_0 = {str(ids[0]): Change(None, t0 + timedelta(seconds=9))}
    assert current_summary(newest_first, delete_of_0) is None  # covered by both
    assert current_summary(newest_first, {str(ids[5]): Change(None, t0 + timedelta(seconds=9))}) is newer
    # Written after the change (the memory stage summarised again from the edited text): current.
    redone = Summary(3, str(ids[3]), "redone", 5, "r3", t0 + timedelta(seconds=20))
    assert current_summary([redone, newer, older], edit_of_2) is redone


def test_a_recalled_message_the_user_deleted_or_edited_is_not_recalled_until_embedded_again():

    at = datetime.now(UTC)
    kept, gone, edited, redone = (str(uuid.uuid1()) for _ in range(4))
    found = [
        Recalled(kept, "user", "green", [0.0]),
        Recalled(gone, "user", "red", [0.0]),
        Recalled(edited, "user", "blue", [0.0]),
        Recalled(redone, "user", "teal", [0.0]),
    ]
    changes = {gone: Change(None, at), edited: Change("navy", at), redone: Change("teal", at)}
    assert [r.id for r in as_changed(found, changes)] == [kept, redone]
