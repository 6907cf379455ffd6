"""The Responses API with the official `openai` client against the stack: whole, streamed and chained responses,
background ones polled, streamed again from another replica after `starting_after`, and cancelled; tools and
structured output."""

import json

import openai
import pytest
from pydantic import BaseModel

from topics import codec
from topics.pipeline import RUN_COMPLETED

from .conftest import PORT_BASE, for_run, read_topic

MODEL = "smollm2-135m-instruct"
LONG = "smollm2-135m-instruct-8k"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


class City(BaseModel):
    city: str
    country: str


def client_of(token: str, replica: int = 0) -> openai.OpenAI:
    port = PORT_BASE if replica == 0 else PORT_BASE + 100 * replica
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=token, max_retries=0)


@pytest.fixture
def token(live):
    return live.token()


def run_record(live, response_id: str) -> dict:
    run_id = response_id.removeprefix("resp_")
    run_id = f"{run_id[:8]}-{run_id[8:12]}-{run_id[12:16]}-{run_id[16:20]}-{run_id[20:]}"
    done = read_topic(live.topic(RUN_COMPLETED), for_run("RunCompleted", run_id))
    return codec.decode("RunCompleted", done[0].value())


def test_a_response_whole_streamed_and_chained(live, token):
    with client_of(token) as client:
        first = client.responses.create(
            model=MODEL, input="Say hello.", instructions="You are terse.", max_output_tokens=16, temperature=0
        )
        assert first.id.startswith("resp_") and first.status in ("completed", "incomplete")
        assert first.output_text and first.usage.input_tokens > 0 and 0 < first.usage.output_tokens <= 16
        assert client.responses.retrieve(first.id).output_text == first.output_text  # stored, read back

        with client.responses.stream(  # an answer that ends before its limit: response.completed
            model=MODEL, input="Name three colours.", instructions="You are terse.", max_output_tokens=48, temperature=0
        ) as stream:
            events = list(stream)
            final = stream.get_final_response()
        assert [e.sequence_number for e in events] == list(range(len(events)))
        kinds = [e.type for e in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert streamed and streamed == final.output_text

        second = client.responses.create(
            model=MODEL, input="Say it again.", previous_response_id=first.id, max_output_tokens=8
        )
        given = run_record(live, second.id)["prompt"]["messages"]
        # the earlier turn, not its instructions (each response has its own), then the new input
        assert [(m["role"], m["content"]) for m in given] == [
            ("user", "Say hello."),
            ("assistant", first.output_text),
            ("user", "Say it again."),
        ]
        assert second.previous_response_id == first.id
    with client_of(live.token()) as stranger:  # another person's response is not there at all
        with pytest.raises(openai.NotFoundError):
            stranger.responses.retrieve(first.id)
        with pytest.raises(openai.NotFoundError):
            stranger.responses.create(model=MODEL, input="Hi", previous_response_id=first.id)


def test_a_background_response_is_polled_resumed_on_another_replica_and_cancelled(live, token):
    with client_of(token) as client, client_of(token, replica=1) as other:
        queued = client.responses.create(
            model=LONG,  # room for an answer that outlasts the cancel
            # hundreds of tokens (the model ended a shorter ask before a cancel arrived)
            input="Write a very long story about the sea, at least 2000 words, in many chapters.",
            background=True,
            max_output_tokens=4000,
        )
        assert queued.status == "queued" and queued.background
        seen, text = -1, []
        with client.responses.retrieve(queued.id, stream=True) as events:
            for event in events:
                seen = event.sequence_number
                if event.type == "response.output_text.delta":
                    text.append(event.delta)
                    if len(text) == 3:
                        break  # the client goes away: a background response goes on
        resumed = other.responses.retrieve(queued.id, stream=True, starting_after=seen)
        first = next(iter(resumed))
        assert first.sequence_number == seen + 1
        if first.type == "response.output_text.delta":
            text.append(first.delta)
        cancelled = other.responses.cancel(queued.id)
        assert cancelled.id == queued.id
        last = None
        for event in resumed:
            last = event
            if event.type == "response.output_text.delta":
                text.append(event.delta)
        assert last.type == "response.incomplete" and last.response.status == "cancelled"
        polled = client.responses.retrieve(queued.id)
        assert polled.status == "cancelled" and polled.output_text == "".join(text)
        assert 0 < polled.usage.output_tokens < 4000
        plain = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4)
        with pytest.raises(openai.BadRequestError):
            client.responses.cancel(plain.id)  # only a background response


def test_tools_and_structured_output_on_responses(token):
    with client_of(token) as client:
        called = client.responses.create(
            model=MODEL,
            input="What is the weather in Paris?",
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=48,
            temperature=0,
        )
        (call,) = [item for item in called.output if item.type == "function_call"]
        assert call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}
        answered = client.responses.create(
            model=MODEL,
            previous_response_id=called.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}],
            tools=[WEATHER],
            max_output_tokens=24,
            temperature=0,
        )
        assert answered.status in ("completed", "incomplete") and answered.output
        parsed = client.responses.parse(
            model=MODEL, input="Name a city and its country.", text_format=City, max_output_tokens=60, temperature=0
        )
        assert isinstance(parsed.output_parsed, City)
