"""Pure parts of the inference stage: pool routing, both engines' stream formats, takeover bookkeeping."""

from types import SimpleNamespace

import pytest

from api.routes.openai import conversation_key
from conversation.context import TooLong
from conversation.gather import assemble_given
from inference.completion import usage_after
from inference.engine import OpenAIStreamEngine, Outcome, Request, parse_sse_line
from inference.takeover import prior_of
from processors.settings import ProcessorSettings

from .test_stages import prompt

SETTINGS = ProcessorSettings()


def test_a_short_chat_goes_to_the_small_pool_a_long_one_to_the_large():
    short = [{"role": "user", "content": "Hi"}]
    run = assemble_given(prompt(max_tokens=256, messages=short), SETTINGS)
    assert (run["pool"], run["model"]) == ("small", "smollm2-135m-instruct")
    assert run["context"]["prompt_tokens"] == run["estimate_tokens"] - 256 == 31  # the serving tokenizer's count
    long = [{"role": "user", "content": "word " * 2000}]  # 2,000 tokens: with its answer beyond 2,048
    run = assemble_given(prompt(max_tokens=256, messages=long), SETTINGS)
    assert (run["pool"], run["model"]) == ("large", "smollm2-135m-instruct-8k")


def test_a_requested_model_picks_its_pool_and_nothing_fits_beyond_the_largest():
    short = [{"role": "user", "content": "Hi"}]
    assert assemble_given(prompt(model="smollm2-135m-instruct-8k", messages=short), SETTINGS)["pool"] == "large"
    huge = [{"role": "user", "content": "x y " * 5_000}]
    with pytest.raises(TooLong, match="8192"):
        assemble_given(prompt(max_tokens=256, messages=huge), SETTINGS)


def test_the_door_counts_a_request_as_the_scheduler_does_and_never_more(monkeypatch):
    """One size for a request: the edge's door counts the messages it brings with the serving tokenizer, as the
    scheduler counts them (the OpenAI route's conversation is used as sent; a chat's adds its system prompt and
    history), so the door's count is a lower bound of the scheduler's and it never sheds on a larger one."""
    import api.runs as runs

    text = "The quick brown fox jumps over the lazy dog. " * 40  # SmolLM2: about 10 tokens per sentence
    messages = [{"role": "user", "content": text}]
    seen: list[int] = []
    monkeypatch.setattr(runs, "at_the_door", lambda model, least_tokens, *rest: seen.append(least_tokens))
    deps = SimpleNamespace(
        settings=SimpleNamespace(pools=SETTINGS.pools, default_pool=SETTINGS.default_pool),
        pools=SimpleNamespace(loads=dict, pending=lambda run_id, pool, tier: None),
        limits=SimpleNamespace(tiers_for=lambda user, tier: None),
    )
    runs.shed_when_full(deps, SimpleNamespace(user_id="u", tier="pro"), "r1", None, messages, 7, False)
    run = assemble_given(prompt(max_tokens=7, messages=messages), SETTINGS)
    assert seen == [run["estimate_tokens"]] and run["context"]["prompt_tokens"] >= 400


def test_llama_server_stream_chunks_with_per_token_timings():
    # As this repo's llama-server build streams them (timings_per_token): prompt_n new + cache_n reused.
    line = (
        'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" water"}}],"created":1,'
        '"id":"chatcmpl-x","model":"m","object":"chat.completion.chunk","timings":{"cache_n":41,'
        '"prompt_n":2,"prompt_ms":10.1,"predicted_n":3,"predicted_ms":40.0}}'
    )
    chunk = parse_sse_line(line)
    assert chunk is not None
    assert (chunk.text, chunk.prompt_tokens, chunk.cached_tokens, chunk.completion_tokens) == (" water", 43, 41, 3)


def test_a_taken_over_run_continues_after_its_published_text():
    engine = OpenAIStreamEngine("sglang", "http://engine")
    request = Request("r", "m", [{"role": "user", "content": "Tell me"}], 40, continuation="Once upon")
    body = engine.body(request)
    assert body["messages"][-1] == {"role": "assistant", "content": "Once upon"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    fresh = engine.body(Request("r", "m", [{"role": "user", "content": "Tell me"}], 40))
    assert fresh["messages"][-1]["role"] == "user" and "continue_final_message" not in fresh


def record(seq, kind, text="", tokens=None, **extra):
    return {
        "run_id": "r",
        "seq": seq,
        "kind": kind,
        "text": text,
        "tokens": tokens,
        "finish_reason": None,
        "usage": None,
        "error_message": None,
        **extra,
    }


def test_prior_folds_records_in_seq_order_once_each():
    records = [
        record(2, "delta", " upon", 3),
        record(0, "started"),
        record(1, "delta", "Once", 1),
        record(2, "delta", " upon", 3),
    ]
    prior = prior_of(records)
    assert (prior.text, prior.seq, prior.tokens, prior.terminal) == ("Once upon", 2, 3, None)
    assert prior.started
    assert not prior_of([]).started
    ended = prior_of([*records, record(3, "completed", tokens=3, finish_reason="stop")])
    assert ended.terminal is not None and ended.terminal["seq"] == 3


def test_usage_of_a_continued_run_counts_the_earlier_text_once_as_completion():
    prior = prior_of([record(0, "started"), record(1, "delta", "Once upon", 5)])
    outcome = Outcome(prompt_tokens=35, completion_tokens=7, cached_tokens=0)  # engine prompt = 30 + 5 published
    assert usage_after(prior, outcome) == {"prompt_tokens": 30, "completion_tokens": 12, "cached_tokens": 0}
    fresh = Outcome(prompt_tokens=30, completion_tokens=7, cached_tokens=20)
    assert usage_after(prior_of([]), fresh) == {"prompt_tokens": 30, "completion_tokens": 7, "cached_tokens": 20}


def test_a_stateless_conversation_keeps_its_routing_key_across_turns():
    turn1 = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    turn2 = [*turn1, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "And?"}]
    assert conversation_key("u1", turn1) == conversation_key("u1", turn2)
    assert conversation_key("u1", turn1) != conversation_key("u2", turn1)
    assert conversation_key("u1", turn1) != conversation_key("u1", [{"role": "user", "content": "Other"}])


class _Published:
    def __init__(self):
        self.records = []

    async def publish(self, topic, record, **_):
        self.records.append((topic, record))


class _Engine:
    """Answers every request with one token and keeps what it was asked."""

    def __init__(self):
        self.requests = []

    async def stream(self, request):
        self.requests.append(request)
        yield "x", Outcome(finish_reason="stop", completion_tokens=1, pieces=1)

    async def abort(self, request):
        pass


@pytest.mark.parametrize("prior_words, asked", [(20, True), (200, False)])
def test_a_taken_over_run_asks_only_for_what_the_pools_context_still_holds(prior_words, asked):
    """The published text goes back in re-tokenized, which the engine counts against its context length: the
    rest of the answer is clamped to the room left (SGLang refuses a request beyond --context-length), and a
    continuation that leaves no room ends the run at its length without asking the engine."""
    import asyncio
    import time

    from conversation import tokens
    from inference.run import Flight, RunServer
    from inference.settings import InferenceSettings
    from inference.takeover import Prior
    from runtime.settings import Pool

    settings = InferenceSettings(pools={"small": Pool(model="m", context=160)}, pool="small")
    engine, producer = _Engine(), _Published()
    runs = RunServer(settings, engine, producer, None, None, None, lambda: None)
    text = " ".join(f"word{i}" for i in range(prior_words))
    messages = [{"role": "user", "content": "Count for me, please."}]
    prior = Prior(text=text, seq=3, tokens=prior_words)

    async def known(_flight):
        return prior

    runs.prior = known
    run_id = "r-clamp"
    prompt_ = {"run_id": run_id, "chat_id": "c", "user_id": "u", "tier": "free", "message_id": run_id,
               "content": "", "max_tokens": 400, "temperature": 0.0, "reply_partition": 0}  # fmt: skip
    run = {"prompt": prompt_, "pool": "small", "model": "m", "messages": messages, "priority": 0,
           "scheduled_at": int(time.time() * 1000)}  # fmt: skip
    done = asyncio.run(runs.serve(Flight(None, run, 0, maybe_started=True)))
    held = tokens.load(settings.pools["small"].tokenizer).count_continued(messages, text)
    assert held > prior_words  # re-tokenized, the words count more tokens than were generated
    if asked:
        (request,) = engine.requests
        assert request.continuation == text and request.max_tokens == 160 - held
    else:
        assert engine.requests == [] and held > 160
        assert done["finish_reason"] == "length"
