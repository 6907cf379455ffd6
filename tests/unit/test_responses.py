"""The Responses API's shapes (api/responses.py): a request made into the chat completions request the pipeline
serves, and a run's records folded into a response and its numbered events, the same however the records are
read (tests/stack/test_responses.py runs it all on the stack with the official client)."""

from __future__ import annotations

import json

import pytest

from api.errors import ApiError
from api.openai_request import Completion
from api.replies import Reply
from api.responses import Fold, ResponsesRequest, as_completion, completion_of, earlier_messages


def record(kind: str, seq: int, **fields) -> Reply:
    delta = {"run_id": "r", "chat_id": "c", "seq": seq, "kind": kind, "text": "", **fields}
    return Reply(f"d:0:{seq}", kind, delta)


RUN = [
    record("queued", -1),
    record("started", 0),
    record("delta", 1, text="Hel"),
    record("delta", 2, text="lo"),
    record(
        "delta",
        3,
        tool_calls=json.dumps(
            [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]
        ),
    ),
    record(
        "completed",
        4,
        finish_reason="tool_calls",
        usage={"prompt_tokens": 9, "completion_tokens": 5, "cached_tokens": 2},
    ),
]


def fold(records: list[Reply], background: bool = False) -> tuple[Fold, list[dict]]:
    f = Fold("resp_abc", {"model": "m", "background": background}, 1)
    events = f.start()
    for r in records:
        events += f.feed(r)
    return f, events


def test_a_run_folds_into_a_response_and_its_numbered_events():
    f, events = fold(RUN, background=True)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = events[3]["item"]
    assert added["type"] == "message" and added["content"] == []  # as sent: the text came after it
    response = f.response()
    assert response["status"] == "completed" and f.ended
    message, call = response["output"]
    assert message["content"][0]["text"] == "Hello" and message["status"] == "completed"
    assert (call["call_id"], call["name"], call["arguments"]) == ("call_1", "f", '{"a": 1}')
    assert response["usage"] == {
        "input_tokens": 9,
        "input_tokens_details": {"cached_tokens": 2},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 14,
    }
    _, again = fold(RUN, background=True)  # replayed from the log: the same events, the same numbers
    assert again == events


@pytest.mark.parametrize(
    ("end", "status", "kind", "detail"),
    [
        (
            record("completed", 2, finish_reason="length"),
            "incomplete",
            "response.incomplete",
            {"reason": "max_output_tokens"},
        ),
        (record("completed", 2, finish_reason="cancelled"), "cancelled", "response.incomplete", None),
        (record("error", 2, error_code="engine_error", error_message="boom"), "failed", "response.failed", None),
    ],
)
def test_how_a_run_ends_is_the_response_s_status(end, status, kind, detail):
    f, events = fold([record("started", 0), record("delta", 1, text="Hi"), end])
    assert events[-1]["type"] == kind and f.response()["status"] == status
    assert f.response()["incomplete_details"] == detail
    assert f.feed(record("delta", 3, text="late")) == []  # nothing after its end


def test_a_retraction_cuts_the_text_the_response_keeps():
    f, _ = fold(
        [
            record("delta", 1, text="Fine. Bad words"),
            record("moderation", 2, retract_from=5),
            record("completed", 3, finish_reason="content_filter"),
        ]
    )
    assert f.response()["output"][0]["content"][0]["text"] == "Fine."
    assert f.response()["incomplete_details"] == {"reason": "content_filter"}


def test_input_items_become_the_conversation_the_pipeline_serves():
    body = ResponsesRequest(
        input=[
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Oslo?"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"city": "Oslo"}'},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": '{"city": "Bergen"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "Rain"},
            {"type": "function_call_output", "call_id": "c2", "output": {"sky": "clear"}},
        ],
        instructions="Be brief.",
        tools=[{"type": "function", "name": "w", "parameters": {"type": "object"}}],
        tool_choice={"type": "function", "name": "w"},
        text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": True}},
        max_output_tokens=20,
    )
    request = as_completion(body, [])
    Completion.model_validate(request)  # the chat completions route's own checks accept it
    roles = [(m["role"], m.get("tool_call_id")) for m in request["messages"]]
    assert roles == [("system", None), ("user", None), ("assistant", None), ("tool", "c1"), ("tool", "c2")]
    assert request["messages"][1]["content"] == "Weather in Oslo?"
    assert [c["id"] for c in request["messages"][2]["tool_calls"]] == ["c1", "c2"]  # one turn, two calls
    assert request["messages"][4]["content"] == '{"sky": "clear"}'
    assert request["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert request["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert request["max_tokens"] == 20


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "only text content"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "not supported"),
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "only function tools"),
        ({"input": "Hi", "background": True, "store": False}, "store must be true"),
        ({"input": [{"role": "user", "content": 5}]}, "a text or a list"),
        ({"input": "Hi", "text": {"format": "json"}}, "text.format is an object"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "no spaces", "arguments": "{}"}]}, "pattern"),
    ],
)
def test_what_is_not_served_here_is_a_clear_400(fields, says):
    with pytest.raises(ApiError, match=says) as refused:
        completion_of(ResponsesRequest(**fields), [])
    assert refused.value.status == 400


def test_a_chained_response_carries_the_earlier_turn_without_its_instructions():
    earlier = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    output = [
        {"type": "message", "content": [{"type": "output_text", "text": "Hello"}]},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
    ]
    turn = earlier_messages(earlier, True, output)
    assert turn[0] == {"role": "user", "content": "Hi"}
    assert turn[1]["content"] == "Hello" and turn[1]["tool_calls"][0]["id"] == "c1"
    assert earlier_messages(earlier, False, [])[0]["role"] == "system"  # a system message the client sent
