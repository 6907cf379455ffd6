"""MCP tools in the app on the real stack and in headless Chromium: an admin registers a real MCP server (the
official SDK's) and says which roles may use which tools; a person picks a tool for a message, the inference
consumer calls it, and each call and its result is on the log (`parley runs show`), streamed to the app and
stored with the answer. A tool that hangs, fails, answers 10 MB or carries an injection is a result the model
reads, never a broken run; a server that is down cannot be registered."""

from __future__ import annotations

import json
import uuid

import pytest

from replay.client import ChatClient
from tests.tools.mcp_server import INJECTION, forecast, free_port, start

from .a11y import assert_clean
from .conftest import parley, wait_for
from .test_frontend import answer_when, finished, open_app, send, shot


@pytest.fixture(scope="module")
def registered(live):
    """The test server registered twice: `kit` for every role but auditors (calls bounded to 2 s), `ops`
    (its add only) for admins alone."""
    proc, url = start()
    admin = live.token(f"tools-admin-{uuid.uuid4().hex[:6]}", admin=True)
    with live.client(admin) as client:
        for name, body in (
            (
                "kit",
                {
                    "url": url,
                    "roles": ["member", "admin", "owner"],
                    "timeout_s": 2,
                    "max_result_kib": 64,
                    "tools": ["add", "weather", "fail", "hang", "huge", "note"],
                },
            ),
            ("ops", {"url": url, "roles": ["admin"], "tools": ["add"]}),
        ):
            made = client.put(f"/v1/admin/tool-servers/{name}", json=body)
            assert made.status_code == 200, made.text
    yield admin, url
    with live.client(admin) as client:
        for name in ("kit", "ops"):
            client.delete(f"/v1/admin/tool-servers/{name}")
    proc.kill()
    proc.wait()


def events(run, name: str) -> list[dict]:
    return [e["data"] for e in run.events if e["event"] == name]


def test_admins_register_servers_and_choose_who_may_use_which_tools(live, registered):
    admin, url = registered
    with live.client(admin) as client, live.client(live.token()) as member:
        listed = client.get("/v1/admin/tool-servers").json()["data"]
        servers = {s["name"]: [t["name"] for t in s["tools"]] for s in listed}
        assert servers["ops"] == ["ops__add"] and "kit__note" in servers["kit"]
        down = client.put("/v1/admin/tool-servers/gone", json={"url": f"http://127.0.0.1:{free_port()}/mcp"})
        assert (down.status_code, down.json()["error"]["code"]) == (502, "tool_server_unreachable")
        for name, body, code in (
            ("Bad__Name", {"url": url}, "invalid_value"),
            ("kit2", {"url": url, "tools": ["nope"]}, "invalid_value"),
            ("kit3", {"url": url}, "invalid_tool_schema"),  # its lookup tool's pattern is unanchored
        ):
            refused = client.put(f"/v1/admin/tool-servers/{name}", json=body)
            assert (refused.status_code, refused.json()["error"]["code"]) == (400, code), name
        assert member.put("/v1/admin/tool-servers/x", json={"url": url}).status_code == 403
        mine = {t["name"] for t in member.get("/v1/tools").json()["data"]}
        assert "kit__add" in mine and "ops__add" not in mine
        assert "ops__add" in {t["name"] for t in client.get("/v1/tools").json()["data"]}
        chat = member.post("/v1/chats").json()["id"]
        refused = member.post(f"/v1/chats/{chat}/messages", json={"content": "Add 2 and 3.", "tools": ["ops__add"]})
        assert (refused.status_code, refused.json()["error"]["code"]) == (400, "tool_not_offered")


def test_a_tool_is_called_its_result_read_and_every_call_is_on_the_log(live, registered):
    with live.client(live.token(f"tools-{uuid.uuid4().hex[:6]}")) as client:
        chats = ChatClient(client)
        chat = client.post("/v1/chats").json()["id"]
        run = chats.send(chat, "What is the weather in Oslo?", tools=["kit__weather"], max_tokens=128)
        assert run.completed, run.events[-3:]
        assert events(run, "tool.calls"), run.events
        [asked, *_] = events(run, "tool.calls")
        results = events(run, "tool.result")
        assert results and len(results) <= 8  # the consumer's limit of calls per run
        first = results[0]
        call = asked["tool_calls"][0]
        assert (first["call_id"], first["name"]) == (call["id"], "kit__weather")
        city = json.loads(call["function"]["arguments"])["city"]
        assert first["status"] == "ok" and first["content"] == forecast(city)

        def answer() -> dict | None:
            listed = client.get(f"/v1/chats/{chat}/messages").json()["data"]
            return next((m for m in listed if m["id"] == run.run_id), None)

        stored = wait_for(answer, 30)
        assert [t["call_id"] for t in stored["tools"]] == [r["call_id"] for r in results]
        shown = parley(live, "runs", "show", run.run_id, "--no-stored").stdout
        assert "tool calls kit__weather(" in shown and "tool kit__weather ok" in shown, shown

        outcomes = {}
        for tool in ("hang", "fail", "huge", "note"):
            done = chats.send(chat, "Use the tool.", tools=[f"kit__{tool}"], max_tokens=128)
            assert done.completed and events(done, "tool.result"), (tool, done.events)
            outcomes[tool] = events(done, "tool.result")[0]
        assert {t: o["status"] for t, o in outcomes.items()} == {
            "hang": "timeout", "fail": "error", "huge": "too_large", "note": "blocked"}  # fmt: skip
        assert outcomes["hang"]["duration_ms"] < 10_000
        assert INJECTION not in outcomes["note"]["content"] and len(outcomes["huge"]["content"]) < 300


def test_the_app_picks_a_tool_and_shows_its_call_and_result(live, registered, chromium):
    page = open_app(chromium, live, live.token(f"tools-app-{uuid.uuid4().hex[:6]}"))
    page.click("#tools-button")
    page.check("#tools-picker input[value='kit__weather']")
    assert page.text_content("#tools-button") == "Tools (1)"
    assert_clean(page, "the tools picker open")
    page.click("#tools-button")
    send(page, "What is the weather in Paris?")
    answered = answer_when(page, finished)
    assert answered["status"] == "done"
    page.wait_for_selector(".msg.assistant .tools summary", timeout=10_000)
    summary = page.text_content(".msg.assistant .tools li:first-child summary")
    assert summary.startswith("kit__weather(") and summary.endswith(": ok"), summary
    page.click(".msg.assistant .tools li:first-child summary")
    assert "light rain" in page.text_content(".msg.assistant .tools details[open] .tool-result")
    assert_clean(page, "an answer with its tool call open")
    shown = parley(live, "runs", "show", answered["run"], "--no-stored").stdout  # the app's call, on the log
    assert "tool calls kit__weather(" in shown and "tool kit__weather ok" in shown, shown
    page.reload()  # stored with the answer
    page.wait_for_selector(".msg.assistant .tools summary:has-text('kit__weather')", timeout=20_000)
    shot(page, "tools")
    page.context.close()
