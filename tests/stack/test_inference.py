"""Inference consumers on the real stack: model pools, prefix reuse, a killed consumer, an unhealthy engine."""

import io
import os
import signal
import subprocess
import time
import uuid

import fastavro
import httpx
from confluent_kafka import Producer

from replay.client import ChatClient
from topics import codec
from topics.pipeline import RUN_COMPLETED, RUN_SCHEDULED, TOKEN_DELTA

from ..sse import shown
from .conftest import chat_turn, for_run, read_topic, wait_for

SMALL = ("inference-small-0", "inference-small-1")


def completed_of(live, run_id):
    found = wait_for(lambda: read_topic(live.topic(RUN_COMPLETED), for_run("RunCompleted", run_id), 5), 60)
    assert len(found) == 1, found
    return codec.decode("RunCompleted", found[0].value())


def metric(url, name, default=None):
    for line in httpx.get(url, timeout=5).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return default


def test_long_chats_go_to_the_large_pool_and_their_next_turn_reuses_the_cached_prefix(live):
    client = live.client(live.token())
    assert {m["id"] for m in client.get("/v1/models").json()["data"]} == {
        "smollm2-135m-instruct",
        "smollm2-135m-instruct-8k",
    }
    chat = client.post("/v1/chats").json()["id"]
    notes = " ".join(
        f"Note {i}: the harbour light number {i} is painted {['red', 'green', 'white'][i % 3]}." for i in range(110)
    )  # ~6,600 characters: more than the small pool's 2,048 tokens
    first = chat_turn(client, chat, f"Here are my notes. {notes} Which colour is light 7?", max_tokens=24)
    assert first[0]["event"] == "run.queued" and first[0]["data"]["pool"] == "large"
    assert first[1]["event"] == "run.started" and first[1]["data"]["model"] == "smollm2-135m-instruct-8k"
    assert first[-1]["event"] == "run.completed", first[-1]
    run1 = first[0]["data"]["run_id"]
    assert read_topic(live.topic(RUN_SCHEDULED["large"]), for_run("RunScheduled", run1))
    done1 = completed_of(live, run1)
    assert (done1["pool"], done1["model"]) == ("large", "smollm2-135m-instruct-8k")

    second = chat_turn(client, chat, "And light 8?", max_tokens=16)
    assert second[-1]["event"] == "run.completed", second[-1]
    usage1, usage2 = first[-1]["data"]["usage"], second[-1]["data"]["usage"]
    # The second prompt starts with the whole first turn: the engine reuses it instead of recomputing it.
    assert usage2["prompt_tokens"] > usage1["prompt_tokens"]
    assert usage2["cached_tokens"] >= 0.9 * usage1["prompt_tokens"], (usage1, usage2)
    done2 = completed_of(live, second[0]["data"]["run_id"])
    assert done2["usage"]["cached_tokens"] == usage2["cached_tokens"] and done2["served_by"] == done1["served_by"]

    short = chat_turn(client, client.post("/v1/chats").json()["id"], "Hi!", max_tokens=8)
    assert short[0]["data"]["model"] == "smollm2-135m-instruct"


def test_each_chat_stays_on_the_consumer_that_holds_its_prefix(live):
    client = live.client(live.token())
    chats = [client.post("/v1/chats").json()["id"] for _ in range(4)]
    story = "Remember this list of fruits and their prices: " + ", ".join(
        f"fruit {i} costs {i * 3} cents" for i in range(40)
    )
    firsts = [chat_turn(client, chat, f"{story}. ({n})", max_tokens=12) for n, chat in enumerate(chats)]
    seconds = [chat_turn(client, chat, "What does fruit 5 cost?", max_tokens=12) for chat in chats]
    workers = set()
    for first, second in zip(firsts, seconds, strict=True):
        assert first[-1]["event"] == second[-1]["event"] == "run.completed"
        a = completed_of(live, first[0]["data"]["run_id"])
        b = completed_of(live, second[0]["data"]["run_id"])
        assert a["served_by"] == b["served_by"] and a["pool"] == "small"
        assert b["usage"]["cached_tokens"] >= 0.9 * a["usage"]["prompt_tokens"], (a["usage"], b["usage"])
        workers.add(a["served_by"])
    assert workers <= {f"{live.namespace}-small-0", f"{live.namespace}-small-1"}


def holder(live):
    """The small-pool consumer with a run in flight, or None."""
    for name in SMALL:
        url, _ = live.worker(name)
        if metric(url, "parley_inference_in_flight", 0) >= 1:
            return name
    return None


def test_a_killed_consumers_run_is_continued_by_another_with_no_duplicated_text(live):
    client = live.client(live.token())
    for _attempt in range(3):
        chat = client.post("/v1/chats").json()["id"]
        killed = {}

        def kill_holder(run):
            name = wait_for(lambda: holder(live), 5)
            if name and run.completed is None:
                killed["name"], killed["tokens"] = name, run.tokens
                os.kill(live.worker(name)[1], signal.SIGKILL)  # and keep reading: the stream must go on

        story = "Write a long story about a lighthouse keeper and a storm."
        run = ChatClient(client).send(chat, story, max_tokens=400, when=lambda r: r.tokens >= 4, then=kill_holder)
        assert run.status == 200
        events = run.events
        if killed:
            break
    assert killed, "no run was in flight to kill"
    try:
        assert events[-1]["event"] == "run.completed", events[-3:]
        tokens = [e for e in events if e["event"] == "token"]
        assert len(tokens) > killed["tokens"]
        cursors = [int(e["id"].split(":")[2]) for e in events]
        assert cursors == sorted(set(cursors))
        run_id = events[0]["data"]["run_id"]
        done = completed_of(live, run_id)
        survivor = next(n for n in SMALL if n != killed["name"])
        assert done["served_by"] == f"{live.namespace}-{survivor.removeprefix('inference-')}"
        text = shown(events)
        assert text == done["content"]  # what the client saw is exactly the answer: nothing twice, nothing lost
        stored = client.get(f"/v1/chats/{chat}/messages").json()["data"]
        assert stored[-1]["content"] == text
        assert done["usage"]["completion_tokens"] >= len(tokens) // 2
        records = read_topic(live.topic(TOKEN_DELTA), for_run("TokenDelta", run_id))
        assert len(records) == len(events)
        # The survivor continued after every record the killed consumer published, however the answer ends (a
        # retraction cuts what the client shows): one record per seq, none skipped, none written twice.
        seqs = [codec.decode("TokenDelta", m.value())["seq"] for m in records]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    finally:
        live.stack.start()  # the killed consumer comes back (and takes its partitions back)
        live.stack.wait_ready()


def llama_pid(consumer_pid):
    out = subprocess.run(["pgrep", "-P", str(consumer_pid), "llama-server"], capture_output=True, text=True)
    return int(out.stdout.split()[0])


def test_an_unhealthy_engine_stops_its_consumer_taking_work_until_it_recovers(live):
    url, pid = live.worker("inference-small-1")
    engine = llama_pid(pid)
    os.kill(engine, signal.SIGSTOP)  # hung: the process is there but answers nothing
    try:
        assert wait_for(lambda: metric(url, "parley_inference_engine_healthy") == 0, 30)
        assert wait_for(lambda: metric(url, "parley_inference_taking_work") == 0, 30)
        client = live.client(live.token())
        for _ in range(4):  # every chat is served by the healthy consumer, whatever its partition
            events = chat_turn(client, client.post("/v1/chats").json()["id"], "Hello!", max_tokens=6)
            assert events[-1]["event"] == "run.completed", events[-1]
            done = completed_of(live, events[0]["data"]["run_id"])
            assert done["served_by"] == f"{live.namespace}-small-0"
    finally:
        os.kill(engine, signal.SIGCONT)
    assert wait_for(lambda: metric(url, "parley_inference_engine_healthy") == 1, 30)
    assert wait_for(lambda: metric(url, "parley_inference_taking_work") == 1, 30)
    log = (live.stack.state / "logs" / live.stack.tag / "inference-small-1.log").read_text()
    assert "UNHEALTHY: not taking work" in log and "healthy again" in log


def test_a_run_nobody_served_in_time_fails_with_a_clear_error(live):
    run_id, chat_id = str(uuid.uuid1()), str(uuid.uuid1())
    prompt = {
        "event_id": str(uuid.uuid4()),
        "run_id": run_id,
        "chat_id": chat_id,
        "user_id": "u-expired",
        "tier": "free",
        "message_id": str(uuid.uuid1()),
        "content": "Hi",
        "max_tokens": 8,
        "model": None,
        "reply_partition": 0,
        "prev_run_id": None,
        "messages": None,
        "temperature": None,
        "store": False,
        "created_at": int(time.time() * 1000) - 900_000,
    }
    run = {
        "event_id": str(uuid.uuid4()),
        "prompt": prompt,
        "pool": "small",
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": "Hi"}],
        "context_turns": 0,
        "scheduled_at": int(time.time() * 1000) - 900_000,
    }  # waited 15 minutes: past the 5-minute deadline
    producer = Producer({"bootstrap.servers": "127.0.0.1:9092"})
    producer.produce(live.topic(RUN_SCHEDULED["small"]), key=chat_id, value=codec.encode("RunScheduled", run))
    producer.flush(10)
    done = completed_of(live, run_id)
    assert done["finish_reason"] == "error" and "in time" in done["error_message"]
    replies = [
        codec.decode("TokenDelta", m.value())
        for m in read_topic(live.topic(TOKEN_DELTA), for_run("TokenDelta", run_id))
    ]
    assert [r["kind"] for r in replies] == ["error"] and replies[0]["error_code"] == "run_expired"


class Recorded:
    """The consumer's producer as the serving code uses it: records kept in order instead of sent, each reply
    record written with its Avro schema (so an empty delta is checked to be a valid one)."""

    def __init__(self):
        self.records = []

    async def publish(self, topic, record, **_):
        if topic is TOKEN_DELTA:
            fastavro.schemaless_writer(io.BytesIO(), codec.schemas()[topic.schema], record)
        self.records.append((topic, record))


def test_a_long_prompt_shows_progress_while_it_is_prefilled(tmp_path):
    """A long prompt on a CPU engine can take longer to prefill than the edge's no-progress timeout (CI on a
    slower host: 1,800 tokens took 52 s to the first token, against 60 s, and the run was cut). llama-server
    reports each prefill step; the consumer turns one into an empty delta after `keepalive_s` without a record
    (0 here: every one), which the edge counts as progress and never shows."""
    import asyncio
    import socket

    from inference.engine import OpenAIStreamEngine
    from inference.run import Flight, RunServer
    from inference.settings import InferenceSettings
    from runtime.llama_server import LlamaServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    batch = 64
    server = LlamaServer(
        port=port, slots=1, context=2048, threads=1, batch=batch, alias="m", log_path=tmp_path / "e.log"
    )
    notes = " ".join(f"Note {i}: light {i} is {['red', 'green', 'white'][i % 3]}." for i in range(30))
    run_id = str(uuid.uuid1())
    prompt = {"run_id": run_id, "chat_id": "c1", "user_id": "u1", "tier": "free", "message_id": run_id,
              "content": notes, "max_tokens": 4, "temperature": 0.0, "reply_partition": 0}  # fmt: skip
    run = {"prompt": prompt, "pool": "small", "model": "m", "messages": [{"role": "user", "content": notes}],
           "priority": 0, "scheduled_at": int(time.time() * 1000)}  # fmt: skip
    producer = Recorded()

    async def serve():
        engine = OpenAIStreamEngine("llamacpp", server.url)
        runs = RunServer(InferenceSettings(keepalive_s=0.0), engine, producer, None, None, None, lambda: None)
        try:
            return await runs.serve(Flight(None, run, 0, maybe_started=False))
        finally:
            await engine.aclose()

    server.start(120)
    try:
        done = asyncio.run(serve())
    finally:
        server.process.terminate()
    deltas = [r for topic, r in producer.records if topic is TOKEN_DELTA]
    first_text = next(i for i, r in enumerate(deltas) if r["text"])
    before = [r["kind"] for r in deltas[:first_text]]
    steps = done["usage"]["prompt_tokens"] // batch  # prefill steps the engine reported
    assert before[0] == "started" and before[1:] == ["delta"] * (len(before) - 1), before
    assert len(before) - 1 >= steps >= 4, (before, done["usage"])
    assert [r["seq"] for r in deltas] == list(range(len(deltas)))
    assert "".join(r["text"] for r in deltas) == done["content"] and deltas[-1]["kind"] == "completed"


def test_an_openai_compatible_server_with_a_key_serves_a_run_and_its_refusals_fail_only_the_run(tmp_path):
    """engine=openai: any OpenAI-compatible server someone else runs (vLLM, Ollama, a hosted API), here
    llama-server's own API behind a key: the run streams with its usage, the pool's model name goes as sent,
    a wrong key or an oversized prompt is that run's error (EngineError), never the engine's (EngineDown)."""
    import asyncio
    import socket

    import pytest

    from inference.engine import EngineDown, EngineError, OpenAIStreamEngine, Request, generate
    from runtime.llama_server import LlamaServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = LlamaServer(
        port=port, slots=2, context=1024, threads=1, alias="served-model", log_path=tmp_path / "e.log",
        key_file=tmp_path / "key",
    )  # fmt: skip
    ask = [{"role": "user", "content": "Say hello."}]

    async def answer(engine, request):
        texts, last = [], None
        async for text, outcome in generate(engine, request):
            texts.append(text)
            last = outcome
        return "".join(texts), last

    async def check():
        keyed = OpenAIStreamEngine("openai", server.url, api_key=server.api_key, busy_wait_s=60)
        text, outcome = await answer(keyed, Request("r1", "served-model", ask, 8, temperature=0.0))
        assert text and outcome.finish_reason in ("stop", "length")
        assert outcome.prompt_tokens > 5 and 0 < outcome.completion_tokens <= 8
        assert await keyed.healthy(), keyed.unhealthy_reason
        page = await keyed.metrics()  # what the consumer serves on /engine/metrics
        assert page is not None and b"llamacpp:prompt_tokens_total" in page
        for key in ("wrong-key", None):
            stranger = OpenAIStreamEngine("openai", server.url, api_key=key)
            with pytest.raises(EngineError, match="401"):
                await answer(stranger, Request("r2", "served-model", ask, 8))
            await stranger.aclose()
        huge = [{"role": "user", "content": "lamp " * 3000}]  # beyond a 512-token sequence
        with pytest.raises(EngineError, match="400") as refused:
            await answer(keyed, Request("r3", "served-model", huge, 8))
        assert not isinstance(refused.value, EngineDown)
        text, _ = await answer(keyed, Request("r4", "served-model", ask, 4, temperature=0.0))  # still serving
        assert text
        await keyed.aclose()

    server.start(120)
    try:
        asyncio.run(check())
    finally:
        server.process.terminate()
