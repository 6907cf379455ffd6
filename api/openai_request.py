"""What the OpenAI-compatible `POST /v1/chat/completions` accepts, checked and turned into a run's prompt.

Every field a client sends reaches the engine or is refused: sampling (temperature, top_p, stop, seed, the
penalties, logit_bias), `response_format` (json_object, json_schema: decoding is constrained, and a schema the
engines cannot enforce is a 400, api/structured.py), and tools (`tools`, `tool_choice`, `parallel_tool_calls`,
assistant `tool_calls` and `tool` messages). Fields OpenAI defines that change nothing here (user, metadata,
store...) are accepted and ignored, as before.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api import structured
from api.errors import ApiError
from api.settings import ApiSettings
from topics.events import ChatMessage, Generation

ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
NAME = r"^[a-zA-Z0-9_-]{1,64}$"


class Part(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class FunctionCall(BaseModel):
    name: str = Field(pattern=NAME)
    arguments: str = Field(max_length=100_000)


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str = Field(min_length=1, max_length=128)
    type: Literal["function"] = "function"
    function: FunctionCall


class InMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Part] | None = None
    tool_calls: list[ToolCall] | None = Field(None, max_length=64)
    tool_call_id: str | None = Field(None, min_length=1, max_length=128)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = Field(False, strict=True)


class Function(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(pattern=NAME)
    description: str | None = Field(None, max_length=4096)
    parameters: dict[str, Any] | None = None
    strict: bool | None = Field(None, strict=True)


class Tool(BaseModel):
    type: Literal["function"]
    function: Function


class Named(BaseModel):
    name: str = Field(pattern=NAME)


class NamedChoice(BaseModel):
    type: Literal["function"]
    function: Named


class JsonSchema(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str = Field(pattern=NAME)
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = Field(None, strict=True)


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class Completion(BaseModel):
    """The request. Strict numbers and booleans: a string where the schema says a number is a 400, not
    coerced (schemathesis found "5" accepted as max_tokens)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[InMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, strict=True)
    max_completion_tokens: int | None = Field(None, ge=1, strict=True)
    temperature: float | None = Field(None, ge=0, le=2, strict=True)
    top_p: float | None = Field(None, ge=0, le=1, strict=True)
    stop: str | list[str] | None = Field(None, max_length=4)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1, strict=True)
    presence_penalty: float | None = Field(None, ge=-2, le=2, strict=True)
    frequency_penalty: float | None = Field(None, ge=-2, le=2, strict=True)
    logit_bias: dict[str, int] | None = Field(None, max_length=300)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool = Field(True, strict=True)
    stream: bool = Field(False, strict=True)
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1


def text_of(message: InMessage, index: int) -> str:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    texts = []
    for part in message.content:
        if part.type != "text" or part.text is None:
            what = (
                "images are not supported by this deployment's models"
                if "image" in part.type
                else ""
            )
            text = f"messages[{index}]: only text content is supported" + (
                f" ({what})" if what else ""
            )
            raise ApiError(400, text + ".", "unsupported_content", "messages")
        texts.append(part.text)
    return "".join(texts)


def conversation(settings: ApiSettings, body: Completion) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    for i, message in enumerate(body.messages):
        out: dict[str, Any] = {"role": ROLES[message.role], "content": text_of(message, i)}
        if message.role == "tool":
            if not message.tool_call_id:
                raise bad(f"messages[{i}]: a tool message needs its tool_call_id.", "messages")
            out["tool_call_id"] = message.tool_call_id
        if message.tool_calls:
            if message.role != "assistant":
                raise bad(f"messages[{i}]: only an assistant message has tool_calls.", "messages")
            out["tool_calls"] = json.dumps([c.model_dump() for c in message.tool_calls])
        messages.append(out)  # type: ignore[arg-type]
    last = messages[-1]
    if last["role"] not in ("user", "tool") or not last["content"].strip():
        raise bad("The last message must be a non-empty user or tool message.", "messages")
    size = sum(len(m["content"]) + len(m.get("tool_calls") or "") for m in messages)
    if size > settings.max_content_chars:
        raise ApiError(
            400,
            f"messages are longer than {settings.max_content_chars} characters.",
            "content_too_long",
        )
    return messages


def generation(body: Completion) -> Generation | None:
    """The decoding the client asked for beside temperature; None when it asked for none."""
    out: dict[str, Any] = {
        "top_p": body.top_p,
        "seed": body.seed,
        "stop": [body.stop] if isinstance(body.stop, str) else list(body.stop or ()),
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "logit_bias": checked_bias(body.logit_bias or {}),
        "response_format": response_format(body.response_format),
        "parallel_tool_calls": body.parallel_tool_calls,
        "tools": None,
        "tool_choice": None,
    }
    if body.tool_choice is not None and not body.tools:
        raise bad("tool_choice is only allowed when tools are given.", "tool_choice")
    if body.tools:
        out["tools"], out["tool_choice"] = tools(body)
    if not any(v for k, v in out.items() if k != "parallel_tool_calls"):
        return None
    return out  # type: ignore[return-value]


def checked_bias(bias: dict[str, int]) -> dict[str, int]:
    for token, value in bias.items():
        if not token.isdigit() or not -100 <= value <= 100:
            raise bad(
                "logit_bias maps token ids (digits) to a bias from -100 to 100.", "logit_bias"
            )
    return bias


def response_format(fmt: ResponseFormat | None) -> str | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return json.dumps({"type": "json_object"})
    if fmt.json_schema is None or fmt.json_schema.json_schema is None:
        raise bad("response_format json_schema needs json_schema.schema.", "response_format")
    checked(fmt.json_schema.json_schema, "response_format.json_schema.schema", "response_format")
    spec = {"name": fmt.json_schema.name, "schema": fmt.json_schema.json_schema, "strict": True}
    return json.dumps({"type": "json_schema", "json_schema": spec})


def tools(body: Completion) -> tuple[str, str]:
    """The tools as the engine reads them, and the choice: auto, none, required or function:NAME."""
    assert body.tools
    names = [t.function.name for t in body.tools]
    if len(set(names)) != len(names):
        raise bad("Each tool needs its own function name.", "tools")
    for i, tool in enumerate(body.tools):
        if tool.function.parameters is not None:
            where = f"tools[{i}].function.parameters"
            checked(tool.function.parameters, where, "tools")
    choice = body.tool_choice
    specs = json.dumps([t.model_dump(exclude_none=True) for t in body.tools])
    if not isinstance(choice, NamedChoice):
        return specs, choice or "auto"
    if choice.function.name not in names:
        message = f"tool_choice names '{choice.function.name}', which is not among the tools."
        raise bad(message, "tool_choice")
    return specs, f"function:{choice.function.name}"


def checked(schema: dict[str, Any], where: str, param: str) -> None:
    try:
        structured.check(schema, where)
    except structured.Unenforceable as exc:
        raise bad(str(exc), param) from None


def bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, "invalid_value", param)
