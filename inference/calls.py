"""What a run asks of the engine beyond its messages (sampling, structured output, tools), and the tool calls it
answers with (pure).

- Sampling fields pass under OpenAI's names; llama-server and SGLang both read them.
- `response_format` passes as sent: both engines compile a JSON schema (or "any JSON object") into a grammar
  and decode under it. The edge has refused any schema they cannot enforce (api/openai_tools.py).
- Tools with `tool_choice` auto: passed as sent; the engine describes them to the model through its chat
  template and its own parser turns the model's call syntax into `tool_calls` deltas (llama-server with the
  tool-use template, runtime/llama_server.py; SGLang with `--tool-call-parser`).
- `required` or one named function: the answer must be calls, so decoding is constrained to a JSON array of
  calls, a schema made from the tools (what vLLM does): llama-server's own `required` lets the model write
  any text before its first call, which a small model fills until max_tokens. The tools are still passed
  (described in the prompt), with the engine's own tool parsing off.

A run's tool calls are published whole, in one record before its end (inference/run.py): a run taken over
mid-call starts its calls again rather than continuing half an argument.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from topics.events import ChatMessage, Generation

SAMPLING = ("top_p", "seed", "presence_penalty", "frequency_penalty")


def engine_message(message: ChatMessage) -> dict[str, Any]:
    """A prompt message as the engines read it: a tool call's arguments and a tool result pass through."""
    out: dict[str, Any] = {"role": message["role"], "content": message["content"]}
    if calls := message.get("tool_calls"):
        out["tool_calls"] = json.loads(calls)
    if call_id := message.get("tool_call_id"):
        out["tool_call_id"] = call_id
    return out


def engine_options(generation: Generation | None) -> tuple[dict[str, Any], bool]:
    """The request body's fields for the client's generation settings, and whether the answer must be tool
    calls (constrained here, parsed by `forced_calls`)."""
    if not generation:
        return {}, False
    body: dict[str, Any] = {
        name: generation.get(name) for name in SAMPLING if generation.get(name) is not None
    }
    if generation.get("stop"):
        body["stop"] = list(generation["stop"])
    if generation.get("logit_bias"):
        body["logit_bias"] = dict(generation["logit_bias"])
    if fmt := generation.get("response_format"):
        body["response_format"] = json.loads(fmt)
    tools = json.loads(spec) if (spec := generation.get("tools")) else None
    choice = generation.get("tool_choice") or "auto"
    parallel = generation.get("parallel_tool_calls", True)
    if not tools:
        return body, False
    body["tools"] = tools
    if choice in ("auto", "none"):
        body["tool_choice"] = choice
        if choice == "auto":
            body["parallel_tool_calls"] = parallel
        return body, False
    body["tool_choice"] = (
        "none"  # described in the prompt; the schema below decides the answer's shape
    )
    body["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "tool_calls", "schema": forced_schema(tools, choice, parallel)},
    }
    return body, True


def forced_schema(tools: list[dict[str, Any]], choice: str, parallel: bool) -> dict[str, Any]:
    """A JSON array of calls: to the one named function, or (required) to any of the tools."""
    functions = [t["function"] for t in tools]
    if choice != "required":  # function:NAME
        functions = [f for f in functions if f["name"] == choice.removeprefix("function:")]
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f["name"]},
                "arguments": f.get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in functions
    ]
    schema: dict[str, Any] = {
        "type": "array",
        "items": calls[0] if len(calls) == 1 else {"anyOf": calls},
        "minItems": 1,
    }
    if not parallel or choice != "required":
        schema["maxItems"] = 1
    return schema


def forced_calls(text: str) -> list[dict[str, Any]] | None:
    """The calls in a constrained answer, as OpenAI writes them; None when it is not whole (cut by max_tokens).
    llama-server may fence the JSON in a json code block."""
    body = text.strip().removeprefix("```json").removesuffix("```").strip()
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if not isinstance(parsed, list) or not parsed:
        return None
    return [
        call(c["name"], json.dumps(c.get("arguments", {})))
        for c in parsed
        if isinstance(c, dict) and "name" in c
    ] or None


def call(name: str, arguments: str, call_id: str | None = None) -> dict[str, Any]:
    return {
        "id": call_id or f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


class Calls:
    """The tool calls an engine streams as OpenAI deltas (by index, arguments in pieces), put together."""

    def __init__(self) -> None:
        self.parts: dict[int, dict[str, Any]] = {}

    def add(self, deltas: list[dict[str, Any]]) -> None:
        for delta in deltas:
            part = self.parts.setdefault(
                int(delta.get("index") or 0), {"id": None, "name": "", "arguments": ""}
            )
            part["id"] = delta.get("id") or part["id"]
            function = delta.get("function") or {}
            part["name"] += function.get("name") or ""
            part["arguments"] += function.get("arguments") or ""

    def whole(self) -> list[dict[str, Any]]:
        return [
            call(p["name"], p["arguments"] or "{}", p["id"])
            for _, p in sorted(self.parts.items())
            if p["name"]
        ]
