"""The Responses API's shapes (pure): a request made into the chat completions request the pipeline already
serves, and a run's reply records folded into a response object and its semantic stream events.

The events are a function of the run's records alone, numbered from the start: a stream read live and one
replayed from the log (any replica, `starting_after`) number every event alike, so a client resumes after the
last `sequence_number` it saw and misses nothing. Text streams as the run's deltas; a run's tool calls arrive
whole (inference/calls.py), each as a function_call item with its arguments in one delta.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.errors import ApiError
from api.openai_request import Completion
from api.replies import REJECTED, Reply

FINISHED = {"stop": "completed", "tool_calls": "completed", "length": "incomplete"}
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
TEXT_PARTS = {"input_text", "output_text", "text"}


class ResponsesRequest(BaseModel):
    """OpenAI's request, the parts that change an answer here; the rest (include, reasoning, truncation,
    user, service_tier...) is accepted and changes nothing."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = Field(None, max_length=32_000)
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = Field(None, max_length=128)
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0, le=2, strict=True)
    top_p: float | None = Field(None, ge=0, le=1, strict=True)
    max_output_tokens: int | None = Field(None, ge=1, strict=True)
    parallel_tool_calls: bool = Field(True, strict=True)
    stream: bool = Field(False, strict=True)
    background: bool = Field(False, strict=True)
    store: bool = Field(True, strict=True)
    metadata: dict[str, str] | None = Field(None, max_length=16)


class ResponseObject(BaseModel):
    """OpenAI's response object (the request's settings are shown beside these)."""

    model_config = ConfigDict(extra="allow")
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
    error: dict[str, str] | None
    incomplete_details: dict[str, str] | None
    output: list[dict[str, Any]]
    usage: dict[str, Any] | None
    model: str


def bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, "invalid_value", param)


def completion_of(
    body: ResponsesRequest, earlier: list[dict[str, Any]]
) -> tuple[dict[str, Any], Completion]:
    """`as_completion`, checked as the chat completions route checks its body (a 400 naming what is wrong)."""
    request = as_completion(body, earlier)
    try:
        return request, Completion.model_validate(request)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise bad(f"{where}: {first['msg']}", where.split(".")[0]) from None


def as_completion(body: ResponsesRequest, earlier: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat completions request for this one (api/openai_request.py checks it): the instructions, the
    conversation so far (`earlier`, from previous_response_id), then the input items."""
    if body.background and not body.store:
        raise bad("background responses are stored: store must be true.", "background")
    instructions = [{"role": "system", "content": body.instructions}] if body.instructions else []
    messages = instructions + earlier
    items = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    for i, item in enumerate(items):
        messages += item_messages(item, i, messages[-1] if messages else None)
    request: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "max_tokens": body.max_output_tokens,
        "parallel_tool_calls": body.parallel_tool_calls,
    }
    if body.tools:
        request["tools"] = [function_tool(t, i) for i, t in enumerate(body.tools)]
    if isinstance(body.tool_choice, dict):
        if body.tool_choice.get("type") != "function" or "name" not in body.tool_choice:
            raise bad("tool_choice names a function: {type: function, name}.", "tool_choice")
        name = body.tool_choice["name"]
        request["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif body.tool_choice is not None:
        request["tool_choice"] = body.tool_choice
    fmt = (body.text or {}).get("format")
    if fmt is not None and not isinstance(fmt, dict):
        raise bad("text.format is an object: {type: text | json_object | json_schema}.", "text")
    if fmt and fmt.get("type") in ("json_object", "json_schema"):
        request["response_format"] = (
            {"type": "json_object"}
            if fmt["type"] == "json_object"
            else {
                "type": "json_schema",
                "json_schema": {k: v for k, v in fmt.items() if k != "type"},
            }
        )
    return request


def item_messages(
    item: dict[str, Any], i: int, last: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """One input item as chat messages: a message, a function call (joined onto the assistant message before
    it, when that one is calls too), or a call's output."""
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise bad(f"input[{i}].role must be user, assistant, system or developer.", "input")
        return [{"role": role, "content": content_text(item.get("content"), i)}]
    if kind == "function_call":
        call = {
            "id": str(item.get("call_id") or ""),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"},
        }
        if last is not None and last.get("role") == "assistant" and last.get("tool_calls"):
            last["tool_calls"].append(call)
            return []
        return [{"role": "assistant", "content": None, "tool_calls": [call]}]
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else json.dumps(output)
        return [{"role": "tool", "tool_call_id": str(item.get("call_id") or ""), "content": text}]
    raise bad(f"input[{i}]: items of type '{kind}' are not supported.", "input")


def content_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"input[{i}].content is a text or a list of text parts.", "input")
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            message = f"input[{i}]: only text content is supported (not {kind})."
            raise ApiError(400, message, "unsupported_content", "input")
        texts.append(str(part.get("text") or ""))
    return "".join(texts)


def function_tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    if tool.get("type") != "function":
        message = f"tools[{i}]: only function tools are supported (not {tool.get('type')})."
        raise bad(message, "tools")
    spec = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": spec}


def earlier_messages(
    messages: list[dict[str, Any]], instructed: bool, output: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A stored response's conversation for the next one: its messages less its instructions (each response
    has its own), then its output as the assistant's turn."""
    kept = messages[1:] if instructed else list(messages)
    text = "".join(
        p["text"] for item in output if item["type"] == "message" for p in item["content"]
    )
    calls = [
        {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        for item in output
        if item["type"] == "function_call"
    ]
    turn: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        turn["tool_calls"] = calls
    return [*kept, turn] if text or calls else kept


class Fold:
    """A run's records as a response object and its numbered stream events."""

    def __init__(self, response_id: str, shown: dict[str, Any], created_s: int) -> None:
        self.id, self.shown, self.created_s = response_id, shown, created_s
        self.seq = 0
        self.status = "queued" if shown.get("background") else "in_progress"
        self.output: list[dict[str, Any]] = []
        self.message: dict[str, Any] | None = None  # the open text item
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, str] | None = None
        self.incomplete: dict[str, str] | None = None
        self.ended = False

    def response(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_s,
            "status": self.status,
            "error": self.error,
            "incomplete_details": self.incomplete,
            "output": copy.deepcopy(self.output),
            "usage": self.usage,
            **self.shown,
        }

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        # a copy: the items go on changing after the event (and the event may be sent later)
        event = copy.deepcopy({"type": kind, "sequence_number": self.seq, **fields})
        self.seq += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        first = [self.event("response.created", response=self.response())]
        if self.status == "queued":
            first.append(self.event("response.queued", response=self.response()))
        return first

    def feed(self, reply: Reply) -> list[dict[str, Any]]:
        if self.ended:
            return []
        if reply.kind == REJECTED:
            rejection = reply.rejection
            return self.fail(
                rejection["code"], rejection.get("message") or "The request was refused."
            )
        if reply.kind not in ("started", "delta", "moderation", "completed", "error"):
            return []
        record = reply.delta
        events: list[dict[str, Any]] = []
        if self.status == "queued" or reply.kind == "started":
            if self.status != "in_progress":
                self.status = "in_progress"
                events.append(self.event("response.in_progress", response=self.response()))
        if reply.kind == "delta" and record["text"]:
            events += self.text(record["text"])
        if reply.kind == "moderation" and self.message is not None:
            part = self.message["content"][0]
            part["text"] = part["text"][: record.get("retract_from") or 0]
        if reply.kind == "delta" and (made := record.get("tool_calls")):
            events += self.close_text()
            for call in json.loads(made):
                events += self.call(call)
        if reply.kind == "error":
            events += self.close_text()
            return events + self.fail(
                record.get("error_code") or "engine_error",
                record.get("error_message") or "The model failed.",
            )
        if reply.kind == "completed":
            events += self.close_text() + self.complete(record)
        return events

    def text(self, delta: str) -> list[dict[str, Any]]:
        events = []
        if self.message is None:
            self.message = {
                "type": "message",
                "id": f"msg_{self.id.removeprefix('resp_')}",
                "status": "in_progress",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "", "annotations": []}],
            }
            self.output.append(self.message)
            at = len(self.output) - 1
            added = {**self.message, "content": []}  # its part is added next
            events.append(self.event("response.output_item.added", output_index=at, item=added))
            empty = {"type": "output_text", "text": "", "annotations": []}
            events.append(self.event("response.content_part.added", **self.where(), part=empty))
        self.message["content"][0]["text"] += delta
        events.append(
            self.event("response.output_text.delta", **self.where(), delta=delta, logprobs=[])
        )
        return events

    def where(self) -> dict[str, Any]:
        assert self.message is not None
        at = self.output.index(self.message)
        return {"item_id": self.message["id"], "output_index": at, "content_index": 0}

    def close_text(self) -> list[dict[str, Any]]:
        if self.message is None:
            return []
        part, where = self.message["content"][0], self.where()
        self.message["status"] = "completed"
        events = [
            self.event("response.output_text.done", **where, text=part["text"], logprobs=[]),
            self.event("response.content_part.done", **where, part=part),
            self.event(
                "response.output_item.done", output_index=where["output_index"], item=self.message
            ),
        ]
        self.message = None
        return events

    def call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        function = call["function"]
        item = {
            "type": "function_call",
            "id": f"fc_{call['id']}",
            "call_id": call["id"],
            "name": function["name"],
            "arguments": "",
            "status": "in_progress",
        }
        self.output.append(item)
        at, args = len(self.output) - 1, function["arguments"]
        events = [self.event("response.output_item.added", output_index=at, item=dict(item))]
        ids = {"item_id": item["id"], "output_index": at}
        events.append(self.event("response.function_call_arguments.delta", **ids, delta=args))
        item["arguments"], item["status"] = args, "completed"
        events.append(self.event("response.function_call_arguments.done", **ids, arguments=args))
        events.append(self.event("response.output_item.done", output_index=at, item=dict(item)))
        return events

    def complete(self, record: Any) -> list[dict[str, Any]]:
        finish = record.get("finish_reason") or "stop"
        usage = record.get("usage") or {
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "cached_tokens": 0,
        }
        self.usage = {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": usage["cached_tokens"]},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"],
        }
        self.status = "cancelled" if finish == "cancelled" else FINISHED.get(finish, "incomplete")
        if finish in INCOMPLETE:
            self.incomplete = {"reason": INCOMPLETE[finish]}
        self.ended = True
        kind = "response.completed" if self.status == "completed" else "response.incomplete"
        return [self.event(kind, response=self.response())]

    def fail(self, code: str, message: str) -> list[dict[str, Any]]:
        self.status, self.error, self.ended = "failed", {"code": code, "message": message}, True
        return [self.event("response.failed", response=self.response())]
