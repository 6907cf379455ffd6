"""Calls to a real MCP server (the official SDK's, in a process of its own) within a server's limits, and a
run's tool steps as the inference consumer takes them over (runtime/mcp.py, inference/tools.py)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from inference.engine import Request
from inference.takeover import prior_of
from inference.tools import ToolSteps, exchange, pending
from runtime import mcp
from tests.tools.mcp_server import INJECTION, free_port, start


@pytest.fixture(scope="module")
def endpoint():
    proc, url = start()
    yield url
    proc.kill()
    proc.wait()


def row(url: str, timeout_s: float = 3.0, max_bytes: int = 65_536) -> dict:
    return {"name": "calc", "url": url, "auth_env": None, "timeout_s": timeout_s,
            "max_result_bytes": max_bytes}  # fmt: skip


def test_a_server_lists_its_tools_as_openai_functions_and_each_failure_is_a_result(endpoint):
    listed = asyncio.run(mcp.list_tools(endpoint, None, 10))
    names = {t["function"]["name"] for t in listed}
    assert {"add", "fail", "hang", "huge", "note"} <= names
    add = next(t for t in listed if t["function"]["name"] == "add")
    assert add["function"]["parameters"]["required"] == ["a", "b"]

    async def calls():
        return await asyncio.gather(
            mcp.call(row(endpoint), "add", json.dumps({"a": 2, "b": 3})),
            mcp.call(row(endpoint), "fail", "{}"),
            mcp.call(row(endpoint, timeout_s=1.0), "hang", "{}"),
            mcp.call(row(endpoint), "huge", "{}"),
            mcp.call(row(endpoint), "note", "{}"),
            mcp.call(row(endpoint), "add", "not json"),
            mcp.call(row(f"http://127.0.0.1:{free_port()}/mcp"), "add", "{}"),
        )

    ok, failed, hung, huge, note, garbled, down = asyncio.run(calls())
    assert (ok.status, ok.content) == ("ok", "5")
    assert failed.status == "error" and "failed" in failed.content
    assert hung.status == "timeout" and hung.duration_ms < 5_000
    assert huge.status == "too_large" and "10000000 bytes" in huge.content and len(huge.content) < 200
    assert (note.status, note.content) == ("ok", INJECTION)  # the guard is the consumer's (inference/tools.py)
    assert garbled.status == "error"
    assert down.status == "unavailable"
    with pytest.raises(mcp.Unreachable):
        asyncio.run(mcp.list_tools(f"http://127.0.0.1:{free_port()}/mcp", None, 3))


def test_tool_names_are_qualified_by_their_server_and_split_back():
    assert mcp.qualified("calc", "add") == "calc__add"
    assert mcp.split("calc__add") == ("calc", "add")
    assert mcp.split("add") is None
    assert not mcp.SERVER_NAME.match("two__parts") and mcp.SERVER_NAME.match("my-tools")


def delta(seq: int, **fields) -> dict:
    return {"seq": seq, "kind": "delta", "text": "", "tokens": seq, "tool_calls": None, "tool_result": None,
            **fields}  # fmt: skip


def test_a_run_taken_over_mid_tools_continues_after_the_last_result_and_calls_only_what_was_not_answered():
    c1 = {"id": "c1", "type": "function", "function": {"name": "calc__add", "arguments": "{}"}}
    c2 = {**c1, "id": "c2"}
    use = {"call_id": "c1", "name": "calc__add", "arguments": "{}", "status": "ok", "content": "5",
           "duration_ms": 3.0}  # fmt: skip
    records = [
        {"seq": 0, "kind": "started", "text": "", "tokens": None},
        delta(1, tool_calls=json.dumps([c1, c2])),
        delta(2, tool_result=use),
    ]
    prior = prior_of(records)
    assert prior.steps == exchange([c1, c2], "", [use])
    assert pending(prior.steps) == [c2]
    assert prior.uses == [use] and prior.tail == ""
    answered = prior_of([*records, delta(3, tool_result={**use, "call_id": "c2"}), delta(4, text="It is")])
    assert pending(answered.steps) == [] and answered.tail == "It is" and answered.text == "It is"


def test_after_its_calls_a_run_may_call_again_until_its_limit_then_must_answer_in_words():
    tool = {"type": "function", "function": {"name": "calc__add", "parameters": {"type": "object"}}}
    generation = {"tools": json.dumps([tool]), "tool_choice": "required", "server_tools": True}
    steps = ToolSteps(None, None, 2, generation, "pro", "r1")  # type: ignore[arg-type]
    first = Request("r1", "m", [], 40, options={"tools": [tool], "tool_choice": "none",
                    "response_format": {"type": "json_schema"}}, forced_calls=True)  # fmt: skip
    steps.made = 1
    second = steps.next_request(first, [{"role": "tool"}], 15)
    assert (second.options["tool_choice"], second.forced_calls, second.max_tokens) == ("auto", False, 25)
    assert "response_format" not in second.options and second.messages == [{"role": "tool"}]
    steps.made = 2
    assert steps.next_request(second, [], 5).options["tool_choice"] == "none"


class Servers:
    def __init__(self, row: dict) -> None:
        self.row = row

    def get(self, name: str) -> dict | None:
        return self.row if name == self.row["name"] else None


def test_a_run_stopped_while_its_tool_runs_abandons_the_call_and_unoffered_tools_are_never_called(endpoint):
    hang = {"type": "function", "function": {"name": "calc__hang", "parameters": {"type": "object"}}}
    generation = {"tools": json.dumps([hang]), "tool_choice": "required", "server_tools": True}
    steps = ToolSteps(Servers(row(endpoint, timeout_s=30)), None, 8, generation, "pro", "r1")  # type: ignore[arg-type]

    async def stopped_after(seconds: float, calls: list[dict]):
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(seconds, stop.set)
        started = time.perf_counter()
        made = await steps.call(calls, stop)
        return made, time.perf_counter() - started

    call = {"id": "c1", "type": "function", "function": {"name": "calc__hang", "arguments": "{}"}}
    made, took = asyncio.run(stopped_after(0.3, [call]))
    assert made is None and took < 2  # not the 30 s the call may take
    other = {**call, "function": {"name": "calc__add", "arguments": '{"a": 1, "b": 2}'}}  # not offered to the run
    made, _ = asyncio.run(stopped_after(30, [other]))
    assert [(u["status"], u["name"]) for u in made] == [("unavailable", "calc__add")]
