"""Search of a person's chats on the embedded ClickHouse engine (chdb, the SQL a server runs) with the real MiniLM
encoder, through the metering stage's handlers: words ranked and as typed, meaning, never another person's,
a redelivered run adding nothing, an edit replacing its message, and a deleted message or chat never found,
even when its run arrives after the delete."""

import pytest

from api.errors import ApiError
from api.routes.search import SearchHit, checked
from processors import meter_usage, search_index
from processors.meter_usage import Prices
from processors.search_index import Index, find
from safety.encoder import Encoder
from storage import search
from storage.search import Query
from storage.usage import UsageStore
from storage.withdrawals import WITHDRAWN
from tests.unit.fakes import completed, decoded, prompt, rejected, run
from topics.clock import now_ms
from topics.pipeline import MEMORY_CHANGED


@pytest.fixture(scope="module")
def encoder():
    return Encoder()


@pytest.fixture()
def index(tmp_path, encoder):
    store = UsageStore.open(f"chdb://{tmp_path}", "parley_test")
    yield Index(store.backend, store.db, encoder)
    store.close()


def deps(index):
    return meter_usage.Deps(UsageStore(index.backend, index.db), Prices({}), lambda _: None, index)


def said(index, text, answer="Noted.", user="u", chat=None, **extra):
    p = prompt(chat, text, user_id=user, **extra)
    run(meter_usage.on_completed([completed(p, answer)], deps(index)))
    return p


def changed(index, p, action, **fields):
    event = {
        "event_id": "e",
        "chat_id": p["chat_id"],
        "user_id": p["user_id"],
        "action": action,
        "message_id": fields.get("message_id"),
        "role": fields.get("role"),
        "content": fields.get("content"),
        "at": now_ms(),
    }
    run(meter_usage.on_changed([decoded(MEMORY_CHANGED, event)], deps(index)))


def ids(hits):
    return [h["message_id"] for h in hits]


def test_a_query_is_whole_words_and_the_last_word_as_typed():
    assert Query.parse("Tea ligh") == Query(("tea",), "ligh")
    assert Query.parse("tea light ") == Query(("tea", "light"), "")
    assert Query.parse("café, tea.") == Query(("café", "tea"), "")  # punctuation ends a word
    assert Query.parse("x_y") == Query(("x",), "y")  # "_" parts words, as the engine's tokenizer does
    assert Query.parse("  ").terms == 0 and Query.parse("tea tea t").words == ("tea",)


@pytest.mark.parametrize(
    "q,code", [("", "query_empty"), (" ,. ", "query_empty"), (" ".join(["w"] * 10_000), "query_too_long")]
)
def test_an_empty_or_overlong_query_is_a_400(q, code):
    with pytest.raises(ApiError) as refused:
        checked(q)
    assert (refused.value.status, refused.value.code) == (400, code)


def test_a_snippet_is_around_the_first_match_with_every_match_marked():
    content = "Filler words here. " * 20 + "The Lighthouse keeper lit the lighthouse lamp." + " More." * 40
    text, marks = search.snippet(content, Query.parse("lighthouse "))
    assert len(text) <= search.SNIPPET_CHARS + 2 and text.startswith("…") and text.endswith("…")
    assert [text[a:b] for a, b in marks] == ["Lighthouse", "lighthouse"]
    short, marks = search.snippet("lights on", Query.parse("ligh"))
    assert short == "lights on" and [short[a:b] for a, b in marks] == ["lights"]


def test_words_are_ranked_found_as_typed_and_never_another_persons(index):
    once = said(index, "The lighthouse keeper drinks tea.")
    often = said(index, "Lighthouse, lighthouse: every lighthouse needs a keeper.")
    said(index, "Bob's lighthouse keeper secret", user="bob")
    said(index, "Nothing to see here.")
    hits = find(index, "u", "lighthouse keeper ", "words", 20)
    assert ids(hits) == [often["message_id"], once["message_id"]]  # more of the words ranks first
    assert all(h["match"] == "words" and h["highlights"] for h in hits)
    assert SearchHit(**hits[0], chat_title="t").created_at == often["created_at"]  # what the edge answers
    typed = find(index, "u", "lightho", "words", 20)  # as typed so far
    assert set(ids(typed)) == {often["message_id"], once["message_id"]}
    assert find(index, "u", "secret", "words", 20) == []  # bob's word, searched by u
    assert ids(find(index, "bob", "secret", "words", 20))
    assert find(index, "u", "keeper tea xylophone ", "words", 20) == []  # every word must be there


def test_meaning_finds_a_paraphrase_the_words_miss(index):
    cat = said(index, "My cat is called Mochi and she sleeps all day.", answer="What a lovely name.")
    said(index, "How do I bake sourdough bread?", answer="Start with a lively starter.")
    assert find(index, "u", "name of my pet ", "words", 20) == []
    hits = find(index, "u", "what is the name of my pet", "all", 5)
    assert hits and hits[0]["message_id"] == cat["message_id"] and hits[0]["match"] == "meaning"
    assert 0.3 <= hits[0]["score"] <= 1
    assert find(index, "bob", "what is the name of my pet", "all", 5) == []


def test_a_redelivered_run_adds_nothing_and_the_answer_is_found_too(index):
    p = said(index, "Where is the lighthouse?", answer="On the granite cliff.")
    run(meter_usage.on_completed([completed(p, "On the granite cliff.")], deps(index)))
    assert [h["role"] for h in find(index, "u", "granite ", "words", 20)] == ["assistant"]
    assert len(find(index, "u", "lighthouse ", "words", 20)) == 1


def test_runs_that_are_not_chat_messages_are_not_indexed(index):
    said(index, "stateless lighthouse", store=False)
    withdrawn = prompt(None, "withdrawn lighthouse")
    refused = prompt(None, "refused lighthouse")
    batch = [rejected(withdrawn, WITHDRAWN), rejected(refused, "content_filter")]
    run(meter_usage.on_rejected(batch, deps(index)))
    assert ids(find(index, "u", "lighthouse ", "words", 20)) == [refused["message_id"]]


def test_an_edit_replaces_and_a_delete_removes_even_a_run_that_arrives_later(index):
    p = said(index, "The lighthouse is red.")
    changed(index, p, "edited", message_id=p["message_id"], role="user", content="The beacon is blue.")
    assert find(index, "u", "lighthouse ", "words", 20) == []
    assert ids(find(index, "u", "beacon blue ", "words", 20)) == [p["message_id"]]
    run(meter_usage.on_completed([completed(p, "Noted.")], deps(index)))  # the original, redelivered
    assert find(index, "u", "lighthouse ", "words", 20) == []
    changed(index, p, "deleted", message_id=p["message_id"], role="user")
    assert find(index, "u", "beacon ", "all", 20) == []
    # a chat deleted before its run is indexed: the run's rows are dropped on arrival
    late = prompt(None, "A late lighthouse question")
    changed(index, late, "chat_deleted")
    run(meter_usage.on_completed([completed(late, "A late lighthouse answer")], deps(index)))
    assert find(index, "u", "late ", "all", 20) == []
    kept = said(index, "Keep this lighthouse")
    changed(index, kept, "chat_deleted")
    assert find(index, "u", "lighthouse ", "all", 20) == []


def test_a_delete_between_the_check_and_the_insert_removes_the_row_again(index):
    p = prompt(None, "A racing lighthouse")
    row = search_index.question(p) | {"embedding": []}
    original = search.removed
    calls = []

    def racing(backend, db, rows):  # the delete lands right after the first check
        calls.append(1)
        found = original(backend, db, rows)
        if len(calls) == 1:
            search.remove(backend, db, "u", p["chat_id"], "", now_ms())
        return found

    search.removed = racing
    try:
        search.write(index.backend, index.db, [row])
    finally:
        search.removed = original
    assert len(calls) == 2 and find(index, "u", "racing ", "words", 20) == []
