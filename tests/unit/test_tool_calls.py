"""Today's chat completions fields on their way to the engine, and the tool calls on their way back: the request
checked at the edge (api/openai_request.py, api/structured.py), the engine's body (inference/calls.py), and a
run's calls put together from the engine's stream, parsed natively or forced by a schema (inference/engine.py
over httpx's MockTransport; tests/stack/test_openai.py runs them on the real engine)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from api.errors import ApiError
from api.openai_request import Completion, conversation, generation
from api.settings import ApiSettings
from api.structured import Unenforceable, check
from inference import calls
from inference.engine import OpenAIStreamEngine, Request, generate

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


def body(**fields) -> Completion:
    return Completion(messages=[{"role": "user", "content": "Weather in Paris?"}], **fields)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]+$"}}},
        {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer", "maximum": 3}]}},
        {
            "$defs": {"p": {"type": "string", "format": "date"}},
            "type": "object",
            "properties": {"d": {"$ref": "#/$defs/p"}},
        },
    ],
)
def test_a_schema_the_grammar_holds_passes(schema):
    check(schema, "s")


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=a)b"}}}, "pattern"),
        ({"type": "object", "properties": {"a": {"type": "number", "minimum": 0.5}}}, "non-integer"),
        ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "'not'"),
        ({"type": "string", "format": "email"}, "email"),
        ({"$ref": "https://example.com/s.json"}, "remote"),
        ({"type": "nonsense"}, "not a valid JSON schema"),
        ("a string", "must be a JSON schema object"),
    ],
)
def test_a_schema_the_grammar_would_skip_is_refused_naming_why(schema, named):
    with pytest.raises(Unenforceable, match=named):
        check(schema, "s")


def test_the_edge_turns_the_request_into_the_generation_the_engine_gets():
    made = generation(
        body(
            top_p=0.5,
            seed=7,
            stop="\n",
            presence_penalty=0.1,
            frequency_penalty=-0.2,
            logit_bias={"28": 100},
            response_format={"type": "json_object"},
        )
    )
    options, forced = calls.engine_options(made)
    assert not forced
    assert options == {
        "top_p": 0.5,
        "seed": 7,
        "presence_penalty": 0.1,
        "frequency_penalty": -0.2,
        "stop": ["\n"],
        "logit_bias": {"28": 100},
        "response_format": {"type": "json_object"},
    }
    assert generation(body(temperature=0.3)) is None  # temperature has its own field


def test_auto_tools_pass_as_sent_and_a_required_call_is_forced_by_a_schema_from_the_tools():
    options, forced = calls.engine_options(generation(body(tools=[WEATHER, TIME])))
    assert not forced and options["tool_choice"] == "auto" and options["tools"][0]["function"]["name"] == "get_weather"
    options, forced = calls.engine_options(generation(body(tools=[WEATHER, TIME], tool_choice="required")))
    schema = options["response_format"]["json_schema"]["schema"]
    assert forced and options["tool_choice"] == "none" and len(options["tools"]) == 2
    jsonschema.validate(
        [{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}], schema
    )
    with pytest.raises(jsonschema.ValidationError):  # a call needs its required arguments
        jsonschema.validate([{"name": "get_weather", "arguments": {}}], schema)
    with pytest.raises(jsonschema.ValidationError):  # and at least one call
        jsonschema.validate([], schema)
    named = {"type": "function", "function": {"name": "get_time"}}
    options, forced = calls.engine_options(generation(body(tools=[WEATHER, TIME], tool_choice=named)))
    schema = options["response_format"]["json_schema"]["schema"]
    jsonschema.validate([{"name": "get_time", "arguments": {}}], schema)
    for wrong in (
        [{"name": "get_weather", "arguments": {"city": "Oslo"}}],
        [{"name": "get_time", "arguments": {}}] * 2,
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)
    options, _ = calls.engine_options(
        generation(body(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False))
    )
    assert options["response_format"]["json_schema"]["schema"]["maxItems"] == 1


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"tool_choice": "required"}, "tool_choice is only allowed when tools are given"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "not among the tools",
        ),
        ({"tools": [WEATHER, WEATHER]}, "its own function name"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "array", "uniqueItems": True}},
                    }
                ]
            },
            "uniqueItems",
        ),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "needs json_schema.schema"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "string", "format": "uri"}},
                }
            },
            "uri",
        ),
        ({"logit_bias": {"the": 5}}, "token ids"),
        ({"logit_bias": {"5": 101}}, "-100 to 100"),
    ],
)
def test_what_the_engine_could_not_honour_is_a_400_naming_it(fields, code):
    with pytest.raises(ApiError) as refused:
        generation(body(**fields))
    assert refused.value.status == 400 and code in refused.value.message


def test_a_tool_loop_s_messages_carry_their_calls_and_results():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    request = Completion(
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
        ],
        tools=[WEATHER],
    )
    messages = conversation(ApiSettings(), request)
    assert json.loads(messages[1]["tool_calls"]) == [call] and messages[1]["content"] == ""
    assert messages[2] == {"role": "tool", "content": "Sunny, 21 C", "tool_call_id": "call_1"}
    assert calls.engine_message(messages[1])["tool_calls"] == [call]
    for wrong, says in (
        ([{"role": "tool", "content": "x"}], "tool_call_id"),
        ([{"role": "user", "content": "x", "tool_calls": [call]}], "only an assistant"),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "last message"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "images are not supported"),
    ):
        with pytest.raises(ApiError, match=says):
            conversation(ApiSettings(), Completion(messages=wrong))


def engine_streaming(*payloads: dict) -> OpenAIStreamEngine:
    async def answer(request: httpx.Request) -> httpx.Response:
        lines = b"".join(f"data: {json.dumps(p)}\n\n".encode() for p in payloads) + b"data: [DONE]\n\n"
        return httpx.Response(200, content=lines, headers={"content-type": "text/event-stream"})

    client = OpenAIStreamEngine("llama.cpp", "http://engine")
    client._client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    return client


def choice(delta: dict, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


async def run(engine: OpenAIStreamEngine, request: Request) -> tuple[list[str], object]:
    pieces, outcome = [], None
    async for piece, outcome in generate(engine, request):
        pieces.append(piece)
    return pieces, outcome


async def test_calls_the_engine_parsed_are_put_together_from_their_pieces():
    def part(index: int, **fields) -> dict:
        return choice({"tool_calls": [{"index": index, **fields}]})

    engine = engine_streaming(
        part(0, id="a", type="function", function={"name": "get_weather", "arguments": ""}),
        part(0, function={"arguments": '{"city": '}),
        part(1, id="b", type="function", function={"name": "get_time", "arguments": "{}"}),
        part(0, function={"arguments": '"Paris"}'}),
        choice({}, "tool_calls"),
    )
    pieces, outcome = await run(engine, Request("r", "m", [{"role": "user", "content": "?"}], 32))
    assert "".join(pieces) == "" and outcome.finish_reason == "tool_calls"
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in outcome.tool_calls] == [
        ("a", "get_weather", {"city": "Paris"}),
        ("b", "get_time", {}),
    ]


async def test_a_forced_answer_is_never_streamed_as_text_and_becomes_its_calls():
    text = '```json\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]\n```'
    engine = engine_streaming(
        *(choice({"content": text[i : i + 7]}) for i in range(0, len(text), 7)), choice({}, "stop")
    )
    request = Request("r", "m", [{"role": "user", "content": "?"}], 64, forced_calls=True)
    pieces, outcome = await run(engine, request)
    assert "".join(pieces) == "" and outcome.text == [] and outcome.finish_reason == "tool_calls"
    (made,) = outcome.tool_calls
    assert made["id"].startswith("call_") and made["function"]["name"] == "get_weather"
    assert json.loads(made["function"]["arguments"]) == {"city": "Paris"}
    cut = engine_streaming(choice({"content": '[{"name": "get_wea'}), choice({}, "length"))
    _, outcome = await run(cut, request)
    assert outcome.tool_calls == [] and outcome.finish_reason == "length"
    assert "".join(outcome.text) == '[{"name": "get_wea'  # published as text by the run (inference/run.py)
