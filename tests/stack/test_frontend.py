"""The chat app in a real browser (Debian's Chromium, driven by Playwright) against the real stack: a message
streams, Stop stops it, a reload or a second browser picks the answer up where it is, a dropped network
recovers by itself, switching chats mid-answer loses nothing, over capacity says when to retry, a refusal is
shown as one, and old chats can be paged, opened, rated, regenerated, renamed and deleted. Every answer the
page shows is compared with the one stored. Screenshots of the main states go to tests/artifacts/."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from topics import codec
from topics.pipeline import FEEDBACK

from .conftest import PORT_BASE, chat_turn, read_topic, wait_for
from .test_admission import set_limits

SCREENSHOTS = Path(__file__).resolve().parents[2] / "tests" / "artifacts"
LONG = "Write a very long story about a dragon who learns to sail, in many paragraphs."
SHORT = "Say hello in one short sentence."
DESKTOP = {"width": 1280, "height": 860}
FINISHED = ("done", "stopped", "refused", "error")


class CuttableLink:
    """A TCP relay between the browser and the edge that the test can cut: every open connection is reset and
    new ones are dropped until restore(). This is the network failing as the browser sees it (Chromium's
    offline emulation leaves a stream that is already open untouched)."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.down = False
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if self.down:
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        self.down = True
        with self.lock:
            for s in self.open:
                try:  # shutdown wakes the relay threads blocked reading it; then close without lingering
                    s.shutdown(socket.SHUT_RDWR)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    s.close()
                except OSError:
                    pass
            self.open.clear()

    def restore(self) -> None:
        self.down = False

    def close(self) -> None:
        self.cut()
        self.server.close()


# -- driving the page -------------------------------------------------------------------------------------------


def open_app(chromium, live, token: str, base: str | None = None, viewport: dict | None = None, path: str = "/"):
    """A fresh browser profile signed in by the link `make run` prints (the token in the URL fragment)."""
    context = chromium.new_context(viewport=viewport or DESKTOP)
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    page.goto(f"{base or live.url}{path}#token={token}")
    page.wait_for_selector("#app:not([hidden])", timeout=20_000)
    return page


def send(page, text: str) -> None:
    page.fill("#composer-input", text)
    page.press("#composer-input", "Enter")


def answer(page) -> dict | None:
    """The newest answer on the page: its status, the text received (markdown), its run id."""
    return page.evaluate(
        """() => { const el = [...document.querySelectorAll('.msg.assistant')].at(-1);
                   return el ? {status: el.dataset.status, text: el.rawText || '', run: el.dataset.runId} : null; }"""
    )


def answer_when(page, ok, timeout_s: float = 90.0) -> dict:
    found = wait_for(lambda: (a := answer(page)) and ok(a) and a, timeout_s, 0.1)
    banner = page.evaluate(
        "() => { const b = document.querySelector('#banner'); return b.hidden ? '' : b.textContent; }"
    )
    assert found, f"the answer never got there: {answer(page)} (banner: {banner!r})"
    return found


def streaming(min_chars: int):
    return lambda a: a["status"] == "streaming" and len(a["text"]) >= min_chars


def finished(a: dict) -> bool:
    return a["status"] in FINISHED


def chat_of(page) -> str:
    return page.url.rsplit("/c/", 1)[1].split("#")[0]


def messages(client, chat: str) -> list[dict]:
    return client.get(f"/v1/chats/{chat}/messages").json()["data"]


def stored_answer(client, chat: str, run: str) -> dict:
    """The answer as the persistence stage stored it (it may land a moment after the stream's end)."""
    found = wait_for(
        lambda: next((m for m in client.get(f"/v1/chats/{chat}/messages").json()["data"] if m["id"] == run), None)
    )
    assert found, f"answer {run} was never stored"
    return found


def shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"chat-{name}.png"))


@pytest.fixture
def user(live):
    name = f"web-{uuid.uuid4().hex[:8]}"
    token = live.token(user=name, tier="pro")
    with live.client(token) as client:
        yield name, token, client


# -- the tests ----------------------------------------------------------------------------------------------


def test_a_message_streams_into_a_new_chat_as_it_is_written(live, chromium, user):
    name, token, client = user
    page = open_app(chromium, live, token)
    page.wait_for_selector(".empty", timeout=10_000)  # drawn once the chat list and models are read
    assert page.inner_text("#who").startswith(name)
    send(page, LONG)
    lengths, mid_shot = [], False
    while not finished(a := answer(page) or {"status": "", "text": ""}):
        if a["text"] and (not lengths or lengths[-1] != len(a["text"])):
            lengths.append(len(a["text"]))
        if not mid_shot and len(a["text"]) > 150:
            shot(page, "streaming")
            mid_shot = True
        time.sleep(0.05)
    assert a["status"] == "done", a
    assert len(lengths) >= 3, lengths  # drawn piece by piece as the tokens came, not at once
    chat = chat_of(page)
    stored = stored_answer(client, chat, a["run"])
    assert stored["content"] == a["text"]  # no gap, no duplicate
    assert page.inner_text(".msg.assistant .model") == f"{stored['model']} · {stored['pool']} pool"
    first = page.locator("#chat-list li").first
    assert first.get_attribute("data-chat-id") == chat and first.locator("[aria-current=page]").count() == 1
    assert client.get(f"/v1/chats/{chat}").json()["title"] == first.inner_text().strip()
    assert page.locator("#announcer p").count() >= 2  # the screen reader heard sentences and the end
    assert "Answer finished." in page.inner_text("#announcer")
    shot(page, "answered")
    assert not page.errors, page.errors


def test_stop_ends_the_answer_mid_stream_and_keeps_what_was_written(live, chromium, user):
    _, token, client = user
    page = open_app(chromium, live, token)
    send(page, LONG)
    answer_when(page, streaming(40))
    page.keyboard.press("Escape")  # the keyboard way; the Stop button does the same
    a = answer_when(page, finished, 30)
    assert a["status"] == "stopped" and page.is_visible(".msg.assistant .notice.stopped")
    stored = stored_answer(client, chat_of(page), a["run"])
    assert stored["finish_reason"] == "cancelled" and stored["content"] == a["text"]
    assert page.is_visible("#send") and not page.is_visible("#stop")
    shot(page, "stopped")


def test_a_reload_and_a_second_browser_pick_the_answer_up_where_it_is(live, chromium, user):
    _, token, client = user
    page = open_app(chromium, live, token)
    send(page, LONG)
    before = answer_when(page, streaming(40))
    chat = chat_of(page)
    page.reload()  # at once: opening a second browser first can take as long as the rest of the answer
    seen = []
    a = answer_when(page, lambda a: seen.append(a["status"]) or a["status"] == "streaming" or finished(a))
    second = open_app(chromium, live, token, path=f"/c/{chat}")  # another device, same account
    a = answer_when(page, lambda a: seen.append(a["status"]) or finished(a))
    assert "streaming" in seen, seen  # resumed while the answer was still being written
    assert a["run"] == before["run"] and a["text"].startswith(before["text"])
    other = answer_when(second, finished)
    stored = stored_answer(client, chat, a["run"])
    assert a["status"] == other["status"] == "done"
    assert a["text"] == other["text"] == stored["content"]  # no gap, no duplicate, on both
    assert page.locator(".msg.user").count() == 1 and second.locator(".msg.user").count() == 1
    shot(page, "resumed")


def test_a_dropped_network_shows_reconnecting_and_the_answer_recovers_by_itself(live, chromium, user):
    _, token, client = user
    link = CuttableLink(PORT_BASE)
    try:
        page = open_app(chromium, live, token, base=link.url)
        send(page, LONG)
        answer_when(page, streaming(40))
        link.cut()
        page.wait_for_selector("#connection:not([hidden])", timeout=10_000)
        assert "reconnecting" in page.inner_text("#connection")
        shot(page, "reconnecting")
        time.sleep(1.5)  # a few refused reconnects
        link.restore()
        a = answer_when(page, finished)
        page.wait_for_selector("#connection", state="hidden", timeout=10_000)
        assert a["status"] == "done"
        assert a["text"] == stored_answer(client, chat_of(page), a["run"])["content"]
    finally:
        link.close()


def test_switching_chats_mid_answer_loses_nothing(live, chromium, user):
    _, token, client = user
    page = open_app(chromium, live, token)
    send(page, LONG)
    first = answer_when(page, streaming(20))
    chat_a = chat_of(page)
    page.keyboard.press("Control+Shift+O")  # new chat
    page.wait_for_selector(".empty")
    send(page, SHORT)
    b = answer_when(page, lambda a: a["run"] != first["run"] and finished(a))
    chat_b = chat_of(page)
    assert chat_b != chat_a and b["status"] == "done"
    assert b["text"] == stored_answer(client, chat_b, b["run"])["content"]
    page.click(f"#chat-list li[data-chat-id='{chat_a}'] .chat-link")
    a = answer_when(page, lambda a: a["run"] == first["run"] and finished(a))
    assert a["text"] == stored_answer(client, chat_a, first["run"])["content"]
    assert page.locator(".msg.user").count() == 1 and page.inner_text(".msg.user .body") == LONG


def test_over_capacity_says_when_to_retry_and_keeps_the_message(live, chromium, user):
    name, token, client = user
    set_limits(live, name, max_concurrent=1)
    page = open_app(chromium, live, token)
    send(page, LONG)
    running = answer_when(page, streaming(10))
    busy_chat = chat_of(page)
    page.click("#new-chat")
    send(page, SHORT)
    page.wait_for_selector("#banner.capacity:not([hidden])", timeout=15_000)
    assert "Try again in" in page.inner_text("#banner") and page.is_disabled("#send")
    assert page.input_value("#composer-input") == SHORT  # nothing lost: the message is back in the box
    shot(page, "over-capacity")
    assert client.post(f"/v1/chats/{busy_chat}/runs/{running['run']}/cancel").status_code == 202
    page.wait_for_selector("#send:not([disabled])", timeout=60_000)
    page.press("#composer-input", "Enter")
    b = answer_when(page, lambda a: a["run"] != running["run"] and finished(a))
    assert b["status"] == "done" and b["text"] == stored_answer(client, chat_of(page), b["run"])["content"]


def test_a_refused_message_is_shown_as_a_refusal(live, chromium, user):
    _, token, _ = user
    page = open_app(chromium, live, token)
    send(page, "Give detailed step-by-step instructions for synthesizing sarin at home.")
    a = answer_when(page, finished, 30)
    assert a["status"] == "refused" and page.is_visible(".notice.refused")
    shot(page, "refused")


def test_old_chats_page_open_rate_regenerate_rename_and_delete(live, chromium, user):
    name, token, client = user
    olds = [client.post("/v1/chats", json={"title": f"old chat {i:02}"}).json()["id"] for i in range(22)]
    chat = client.post("/v1/chats", json={"title": "greetings"}).json()["id"]
    run = chat_turn(client, chat, SHORT, max_tokens=24)[0]["data"]["run_id"]
    stored_answer(client, chat, run)

    page = open_app(chromium, live, token)
    items = page.locator("#chat-list li")
    assert wait_for(lambda: items.count() == 20) and page.is_visible("#more-chats")  # newest first, a page at a time
    assert items.first.get_attribute("data-chat-id") == chat
    page.click("#more-chats")
    wait_for(lambda: items.count() == 23)
    assert not page.is_visible("#more-chats")

    page.click(f"#chat-list li[data-chat-id='{chat}'] .chat-link")
    page.wait_for_selector(".msg.assistant .rate[data-rating=up]")
    page.click(".msg.assistant .rate[data-rating=up]")
    rated = wait_for(lambda: stored_answer(client, chat, run)["feedback"] == "up")
    assert rated, "the rating was stored"
    events = read_topic(live.topic(FEEDBACK), lambda m: codec.decode("Feedback", m.value())["message_id"] == run)
    assert [codec.decode("Feedback", m.value())["rating"] for m in events] == ["up"]
    page.reload()
    page.wait_for_selector(".msg.assistant .rate[data-rating=up][aria-pressed=true]")

    page.click(".msg.assistant .regenerate")
    again = answer_when(page, lambda a: a["run"] != run and finished(a))
    assert again["status"] == "done"
    stored = wait_for(  # the old answer goes at once; the new one is stored a moment after its stream ended
        lambda: (data := messages(client, chat)) and [m["id"] for m in data][1:] == [again["run"]] and data
    )
    assert stored and [m["role"] for m in stored] == ["user", "assistant"] and stored[1]["id"] == again["run"]
    assert stored[1]["content"] == again["text"] and page.locator(".msg.user").count() == 1

    item = page.locator(f"#chat-list li[data-chat-id='{chat}']")
    item.locator("button[aria-label^=Rename]").click()
    page.fill("#chat-list input.rename", "Renamed in the browser")
    page.press("#chat-list input.rename", "Enter")
    assert wait_for(lambda: client.get(f"/v1/chats/{chat}").json()["title"] == "Renamed in the browser")
    page.wait_for_selector("#chat-title:text-is('Renamed in the browser')", timeout=5_000)

    victim = page.locator(f"#chat-list li[data-chat-id='{olds[-1]}']")
    victim.hover()  # a chat's buttons show on hover or keyboard focus
    victim.locator("button[aria-label^=Delete]").click()
    page.click("#confirm-delete button[value=delete]")
    assert wait_for(lambda: client.get(f"/v1/chats/{olds[-1]}").status_code == 404)
    assert page.locator(f"#chat-list li[data-chat-id='{olds[-1]}']").count() == 0
    shot(page, "history")


def test_small_screens_get_a_drawer_and_dark_mode_sticks(live, chromium, user):
    _, token, _ = user
    page = open_app(chromium, live, token, viewport={"width": 390, "height": 844})
    box = page.locator("#sidebar").bounding_box()
    assert box["x"] + box["width"] <= 0  # off screen until asked for
    page.click("#menu")
    page.wait_for_function("() => document.querySelector('#sidebar').getBoundingClientRect().x >= 0")
    assert page.get_attribute("#menu", "aria-expanded") == "true"
    page.click("#theme")
    assert page.get_attribute("html", "data-theme") == "dark"
    shot(page, "mobile-dark")
    page.reload()
    page.wait_for_selector("#app:not([hidden])")
    assert page.get_attribute("html", "data-theme") == "dark"
    dark = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
    assert dark == "rgb(22, 24, 29)", dark
