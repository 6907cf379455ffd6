"""Conversation memory on the real stack: budgets counted with the serving tokenizer (checked against the
engine's own prompt_tokens), background summaries on the small pool, retrieval from Cassandra's vector index,
and edits, deletes and resets that memory follows."""

import asyncio
import time
import uuid

from cassandra.cluster import Cluster
from confluent_kafka import Producer

from admission.limits import BACKGROUND_PRIORITY
from conversation import tokens
from processors import remember
from processors.settings import ProcessorSettings
from replay.client import ChatClient
from runtime.settings import DEFAULT_POOLS
from safety.encoder import Encoder
from storage.at_rest import opened
from storage.conversations import Conversations
from storage.documents import Documents
from storage.ids import MIN_ID, epoch_ms, id_time_us, new_id
from storage.memory import Memory
from topics import codec
from topics.pipeline import PROMPT_ACCEPTED, RUN_COMPLETED, RUN_SCHEDULED, TOKEN_DELTA
from topics.sealed import is_sealed

from .conftest import BOOTSTRAP, chat_turn, for_run, read_topic, wait_for

FACT = "My cat is called Pepperoni and she is eleven years old."
# Each question carries its own context, so that the user's turns alone pass the summary trigger (768 tokens
# of the serving tokenizer): the tiny model's answers may be a few words each (CI: after an engine was paused
# and resumed it answered the first turn "Etyrefereng 1919." and then copied itself), and the summary must not
# hang on them.
FILLER = [
    "I am reading about early printing for a school project on the history of books in Europe. Explain how the "
    "printing press changed the way books were made, who paid for the first printed books, and why it mattered "
    "so much for ordinary readers in the towns and villages of the time.",
    "My sister and I are planning our first long trip on foot together. What should I pack for a week of hiking "
    "in the mountains in autumn, with cold nights, some rain, short days and a small tent that we carry in turns? "
    "We have never camped above the tree line before.",
    "I just bought a second-hand bicycle with many gears and I am not sure how to use them. Describe how a "
    "bicycle gear system works, and when a rider should shift to a lower or a higher gear on hills and flats. "
    "I ride to work every day.",
    "At work I often need answers from a manager who is in meetings all day. Give me three tips for writing a "
    "clear email to a colleague who is very busy and reads everything on a phone between two appointments. "
    "I usually write far too much.",
    "We are visiting Iceland and Italy next year and my children keep asking about mountains that breathe fire. "
    "How do volcanoes form, and what is the difference between a shield volcano and a stratovolcano? They are "
    "nine and eleven years old.",
    "This spring I started a few raised beds with tomatoes, beans and courgettes behind the house. What are good "
    "habits for keeping a small vegetable garden healthy through a hot and dry summer with little rain? The "
    "soil is heavy clay and dries out fast.",
    "A friend gave me a jar of sourdough starter and I would like to bake bread every weekend without waste. "
    "Tell me how a sourdough starter works and how often it needs feeding when kept in the fridge. I bake "
    "with white and rye flour.",
    "My nephew beat me at chess by moving his king two squares, and I thought it was illegal at the time. "
    "Explain the rules of chess castling, including the cases where a player is not allowed to castle. We "
    "play every Sunday afternoon.",
]


def chat_records(live, topic, schema, chat_id, timeout_s=20.0):
    def match(msg):
        return msg.key() == chat_id.encode()

    return [codec.decode(schema, m.value()) for m in read_topic(live.topic(topic), match, timeout_s)]


def scheduled_runs(live, chat_id):
    """Every RunScheduled of the chat (chat runs and summary runs), in publish order per pool."""
    out = []
    for topic in RUN_SCHEDULED.values():
        out += chat_records(live, topic, "RunScheduled", chat_id, timeout_s=10)
    return out


def written(done):
    """A summary run that finished its answer (one that gave way to a reply ends cancelled)."""
    return done["prompt"]["summary"] and done["content"] and done["finish_reason"] in ("stop", "length")


def test_a_long_chat_stays_in_budget_summarises_in_the_background_and_recalls_an_old_fact(live):
    client = live.client(live.token())
    chat_id = client.post("/v1/chats", json={"title": "memory"}).json()["id"]
    planted = chat_turn(client, chat_id, FACT, max_tokens=16)
    for turn in range(18):
        chat_turn(client, chat_id, FILLER[turn % len(FILLER)], max_tokens=24)

    # Summaries run in the background at the lowest priority; the turns above never waited for one. Wait for
    # the first to land so the probe's prompt shows where it goes.
    def summarised():
        done = chat_records(live, RUN_COMPLETED, "RunCompleted", chat_id, timeout_s=5)
        return any(written(d) for d in done)

    if not wait_for(summarised, timeout_s=120):
        ended = [
            (d["prompt"]["summary"]["version"], d["finish_reason"], d["content"][:80])
            for d in chat_records(live, RUN_COMPLETED, "RunCompleted", chat_id)
            if d["prompt"]["summary"]
        ]
        raise AssertionError(f"no summary run completed; summary runs that ended: {ended}")
    probe = chat_turn(client, chat_id, "What is my cat called, and how old is she?", max_tokens=16)
    probe_run = probe[0]["data"]["run_id"]

    def listed():
        return client.get(f"/v1/chats/{chat_id}/messages", params={"limit": 100}).json()["data"]

    wait_for(lambda: len(listed()) >= 40)  # the last answer lands
    messages = listed()
    assert len(messages) == 2 * 20  # summary runs are not chat messages
    fact_id = next(m["id"] for m in messages if m["content"] == FACT)
    assert planted[0]["data"]["run_id"]

    runs = scheduled_runs(live, chat_id)
    chat_runs = {r["prompt"]["run_id"]: r for r in runs if not r["prompt"]["summary"]}
    summary_runs = [r for r in runs if r["prompt"]["summary"]]
    assert len(chat_runs) == 20
    assert summary_runs, "no summary was requested although the chat passed the summary trigger"
    assert all(r["pool"] == "small" and not r["prompt"]["store"] and r["priority"] < 0 for r in summary_runs)

    completed = {d["prompt"]["run_id"]: d for d in chat_records(live, RUN_COMPLETED, "RunCompleted", chat_id)}
    budget = DEFAULT_POOLS["small"].prompt_budget
    for run_id, run in chat_runs.items():
        context = run["context"]
        assert context["budget"] <= budget and context["prompt_tokens"] <= context["budget"]
        # our count (serving tokenizer over the chat template) is what the engine counted
        assert context["prompt_tokens"] == completed[run_id]["usage"]["prompt_tokens"], run_id
    # The summary is in the probe's prompt, or the context guard withheld it (a tiny model's summary can read
    # as instructions); either way the run records which version it saw.
    probe_context = chat_runs[probe_run]["context"]
    assert probe_context["summary_version"] == 1 or "summary:1" in probe_context["withheld_ids"], probe_context
    assert any(written(d) for d in completed.values())  # summaries were written

    # The old fact is in the probe's assembled prompt: retrieved by similarity, or kept by the summary.
    run = chat_runs[probe_run]
    text = "\n".join(m["content"] for m in run["messages"])
    assert fact_id not in run["context"]["verbatim_ids"]  # long out of the window
    assert fact_id in run["context"]["retrieved_ids"] or "Pepperoni" in run["messages"][0]["content"]
    assert "Pepperoni" in text


def test_edits_deletes_and_resets_update_memory(live):
    client = live.client(live.token())
    chat_id = client.post("/v1/chats", json={"title": "edits"}).json()["id"]
    chat_turn(client, chat_id, "My locker code is 4417.", max_tokens=8)
    colour_run = chat_turn(client, chat_id, "I like the colour green.", max_tokens=8)[0]["data"]["run_id"]
    messages = client.get(f"/v1/chats/{chat_id}/messages").json()["data"]
    code_id, colour_id = messages[0]["id"], messages[2]["id"]

    assert client.delete(f"/v1/chats/{chat_id}/messages/{code_id}").status_code == 204
    edited = client.patch(f"/v1/chats/{chat_id}/messages/{colour_id}", json={"content": "I like the colour teal."})
    assert edited.status_code == 200 and edited.json()["content"] == "I like the colour teal."
    assert client.patch(f"/v1/chats/{chat_id}/messages/{uuid.uuid1()}", json={"content": "x"}).status_code == 404
    too_long = client.patch(f"/v1/chats/{chat_id}/messages/{colour_id}", json={"content": "y" * 32_001})
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "content_too_long"
    # The colour turn's prompt delivered again: persistence rewrites its message as the log recorded it, and
    # the user's edit, kept beside it, still holds. The next turn's prompt follows it on the chat's partition.
    producer = Producer({"bootstrap.servers": BOOTSTRAP})
    for msg in read_topic(live.topic(PROMPT_ACCEPTED), for_run("PromptAccepted", colour_run)):
        producer.produce(msg.topic(), value=msg.value(), key=msg.key())
    producer.flush(10)
    after = chat_turn(client, chat_id, "Which colour do I like?", max_tokens=8)
    run = next(r for r in scheduled_runs(live, chat_id) if r["prompt"]["run_id"] == after[0]["data"]["run_id"])
    # The user's own messages (an earlier answer may quote the user; it is the model's, and not edited).
    asked = "\n".join(m["content"] for m in run["messages"] if m["role"] == "user")
    assert "My locker code is 4417." not in asked and code_id not in run["context"]["verbatim_ids"]
    assert code_id not in run["context"]["retrieved_ids"]
    assert "I like the colour teal." in asked and "I like the colour green." not in asked
    assert colour_id in run["context"]["verbatim_ids"]

    def listed():
        return {m["id"]: m["content"] for m in client.get(f"/v1/chats/{chat_id}/messages").json()["data"]}

    assert wait_for(lambda: after[0]["data"]["run_id"] in listed())  # persisted after the prompt delivered again
    assert listed()[colour_id] == "I like the colour teal." and code_id not in listed()

    # the memory stage re-embedded the edited text (the vector row holds the new content)
    session = Cluster(["127.0.0.1"], protocol_version=5).connect()
    ks = f"parley_{live.namespace}".replace("-", "_")

    def stored(message_id):
        row = session.execute(
            f"SELECT content FROM {ks}.memory WHERE chat_id = %s AND message_id = %s",
            (uuid.UUID(chat_id), uuid.UUID(message_id)),
        ).one()
        assert row is None or is_sealed(row.content)  # sealed at rest with the person's key
        return opened(row.content) if row else None

    assert wait_for(lambda: stored(colour_id) == "I like the colour teal.")
    assert stored(code_id) is None
    recorded = session.execute(
        f"SELECT content FROM {ks}.messages WHERE chat_id = %s AND message_id = %s",
        (uuid.UUID(chat_id), uuid.UUID(colour_id)),
    ).one()
    # what the log recorded, rewritten by the redelivery; sealed at rest with the person's key
    assert is_sealed(recorded.content) and opened(recorded.content) == "I like the colour green."

    reset = client.post(f"/v1/chats/{chat_id}/context/reset")
    assert reset.status_code == 200
    fresh = chat_turn(client, chat_id, "Hello again.", max_tokens=8)
    run = next(r for r in scheduled_runs(live, chat_id) if r["prompt"]["run_id"] == fresh[0]["data"]["run_id"])
    assert [m["role"] for m in run["messages"]] == ["system", "user"]
    assert run["context"]["verbatim_ids"] == [] and run["context"]["summary_version"] is None
    assert len(client.get(f"/v1/chats/{chat_id}/messages").json()["data"]) == 7  # earlier ones still listed
    session.cluster.shutdown()


def test_a_late_write_of_a_messages_first_text_never_undoes_a_users_edit_delete_or_reset(live):
    """The memory stage embeds a completion and applies an edit concurrently, and may read the chat's changes
    just before the user makes one (CI saw the edited text overwritten by the first one that way): each row is
    written at the time of its text, so whichever write lands last, the user's newer edit, delete or reset
    holds, and a message after a reset is kept."""
    session = Cluster(["127.0.0.1"], protocol_version=5).connect()
    memory = Memory(session, f"parley_{live.namespace}".replace("-", "_"), "memory")
    chat, edited, deleted, before_reset = new_id(), new_id(), new_id(), new_id()
    vector = [0.1] * 384

    async def race():
        # the user's edit and delete first, then the late writes of the first texts
        await memory.remember(chat, edited, "user", "I like the colour teal.", vector, remember.now_us(), "alice")
        await memory.forget(chat, deleted, remember.now_us())
        for message_id, text in ((edited, "I like the colour green."), (deleted, "My locker code is 4417.")):
            await memory.remember(chat, message_id, "user", text, vector, id_time_us(message_id), "alice")
        found = {r.id: r.content for r in await memory.recall(chat, vector, 10, MIN_ID, new_id())}
        await memory.reset(chat, remember.now_us())
        after_reset = new_id()
        await memory.remember(chat, before_reset, "user", "An old turn.", vector, id_time_us(before_reset), "alice")
        await memory.remember(chat, after_reset, "user", "A new turn.", vector, id_time_us(after_reset), "alice")
        kept = {r.id: r.content for r in await memory.recall(chat, vector, 10, MIN_ID, new_id())}
        return found, kept, str(after_reset)

    try:
        found, kept, after_reset = asyncio.run(race())
    finally:
        session.cluster.shutdown()
    assert found == {str(edited): "I like the colour teal."}
    assert kept == {after_reset: "A new turn."}


def test_a_summary_stored_as_the_user_edits_a_message_it_covers_is_taken_back(live):
    """The stage checks for changes before it stores a summary; an edit made after that check whose event it
    handled before the write (which found no summary to drop) would leave a summary of the old text for good."""
    session = Cluster(["127.0.0.1"], protocol_version=5).connect()
    ks = f"parley_{live.namespace}".replace("-", "_")
    edge, memory, settings = Conversations(session, ks, "api"), Memory(session, ks, "memory"), ProcessorSettings()
    counter = tokens.load(settings.pools[settings.memory_pool].tokenizer)
    published = []

    async def publish(topic, record, **_):
        published.append(record)

    # The memory stage's handlers, called directly on the real stores (its Kafka side is left out)
    documents = Documents(session, ks, "memory")
    deps = remember.Deps(publish, Conversations(session, ks, "memory"), memory, Encoder(), settings, counter, documents)
    colour = new_id()

    async def race():
        chat_id, _ = await edge.create_chat("alice", "summary race")
        put_summary = memory.put_summary

        async def edited_meanwhile(chat, summary, owner):  # the user edits after the check, its event handled first
            at = await edge.edit_message(chat_id, colour, "I like the colour teal.")
            change = {"event_id": "e", "chat_id": str(chat_id), "user_id": "alice", "action": "edited",
                      "message_id": str(colour), "role": "user", "content": "I like the colour teal.",
                      "at": epoch_ms(at)}  # fmt: skip
            await remember.on_changed(change, deps)
            await put_summary(chat, summary, owner)

        memory.put_summary = edited_meanwhile
        run_id = str(new_id())
        summary = {"version": 1, "through": str(new_id()), "messages": 2}
        prompt = {"run_id": run_id, "chat_id": str(chat_id), "user_id": "alice", "tier": "free", "message_id": run_id,
                  "content": "", "store": False, "messages": None, "summary": summary,
                  "created_at": int(time.time() * 1000) - 1000}  # fmt: skip
        done = {"prompt": prompt, "content": "The user likes the colour green.", "finish_reason": "stop"}
        await remember.on_completed(done, deps)
        return await memory.latest_summary(chat_id)

    try:
        assert asyncio.run(race()) is None
    finally:
        session.cluster.shutdown()


def test_a_background_run_gives_the_engine_to_a_reply_and_waits_for_the_next_idle_moment(live):
    """A summary run (background priority) is generating on the small pool when a reply arrives on the same
    engine: it stops, so the reply never shares the engine with it, and a background run that arrives while
    the reply is still going waits for it to finish."""
    client = live.client(live.token())
    chat_id = client.post("/v1/chats").json()["id"]
    first = chat_turn(client, chat_id, "Hello there!", max_tokens=8)
    [msg] = read_topic(live.topic(RUN_SCHEDULED["small"]), for_run("RunScheduled", first[0]["data"]["run_id"]))
    template = codec.decode("RunScheduled", msg.value())
    producer = Producer({"bootstrap.servers": BOOTSTRAP})

    def background(story):
        run_id = str(uuid.uuid1())
        prompt = {**template["prompt"], "run_id": run_id, "message_id": run_id, "event_id": str(uuid.uuid4())}
        prompt.update(max_tokens=300, store=False, prev_run_id=None, content=story)
        run = {**template, "event_id": str(uuid.uuid4()), "prompt": prompt, "priority": BACKGROUND_PRIORITY}
        run["messages"] = [{"role": "user", "content": story}]
        producer.produce(live.topic(RUN_SCHEDULED["small"]), codec.encode("RunScheduled", run),
                         key=chat_id.encode(), partition=msg.partition())  # fmt: skip
        producer.flush(10)
        return run_id

    def generating(run_id):
        return read_topic(live.topic(TOKEN_DELTA), for_run("TokenDelta", run_id), timeout_s=5)

    story = background("Write a very long story about a lighthouse keeper and her three cats, in many chapters.")
    assert wait_for(lambda: generating(story), timeout_s=60), "the background run never started"
    reply = chat_turn(client, chat_id, "What is the capital of France?", max_tokens=24)
    assert reply[-1]["event"] == "run.completed", reply[-1]
    reply_id = reply[0]["data"]["run_id"]

    def completion(run_id):
        found = read_topic(live.topic(RUN_COMPLETED), for_run("RunCompleted", run_id), timeout_s=5)
        return codec.decode("RunCompleted", found[0].value()) if found else None

    stopped = wait_for(lambda: completion(story), timeout_s=30)
    answered = completion(reply_id)
    assert stopped["finish_reason"] == "cancelled" and stopped["usage"]["completion_tokens"] < 300, stopped
    # it ended before the reply's first token was generated
    assert stopped["completed_at"] <= answered["completed_at"]
    assert stopped["served_by"] == answered["served_by"]

    # A background run read while a reply is in the engine starts only after that reply ends.
    asked = []
    reply2 = ChatClient(client).send(
        chat_id,
        "Tell me about Paris.",
        max_tokens=48,
        when=lambda r: "run.started" in r.names,
        then=lambda _: asked.append(background("Write a short poem about the sea.")),
    )
    rest, reply2_id, later = reply2.names, reply2.run_id, asked[0]
    assert rest[-1] == "run.completed", rest
    done_later = wait_for(lambda: completion(later), timeout_s=120)
    answered2 = completion(reply2_id)
    assert done_later["finish_reason"] in ("stop", "length"), done_later
    later_started = done_later["completed_at"] - done_later["duration_ms"]  # epoch ms, as every timestamp
    assert later_started >= answered2["completed_at"] - 100, (later_started, answered2)
