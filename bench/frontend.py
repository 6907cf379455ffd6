"""What the chat app adds on top of the edge, on the real local stack with Debian's headless Chromium.

- First token: for the same prompt in a new chat, (a) an HTTP client's time from creating the chat to the
  first `token` event (the baseline; also from sending the message alone), and (b) the page's time from the
  Enter key to the first token drawn in the DOM (the app creates the chat, posts the message, parses the
  stream, renders markdown). Interleaved rounds, so the noisy shared machine treats both alike; medians and
  the median of per-round differences.
- Reload mid-answer: from page.reload() to the running answer shown again with at least the text it had,
  against reloading the same chat once its answer has finished (the baseline: messages only, no stream).
- The bundle: bytes of the built script and stylesheet, raw and gzipped.

Runs its own stack under a fresh namespace and port base; prints JSON, writes bench/results/frontend.json.
Usage: python bench/frontend.py [--rounds 15] [--reloads 5]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from api.auth import credential  # noqa: E402
from infra.stack import Stack  # noqa: E402
from replay.client import ChatClient  # noqa: E402

PORT_BASE = 19400
SHORT = "Say hello in one short sentence."
LONG = "Write a very long story about a dragon who learns to sail, in many paragraphs."
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]

# In the page: the time of the Enter key, and of the first DOM change that shows answer text.
TIMER = """() => {
  window.__t0 = 0; window.__t1 = 0;
  document.querySelector('#composer-input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter') window.__t0 = performance.now(); }, {capture: true, once: true});
  new MutationObserver((_, observer) => {
    const el = [...document.querySelectorAll('.msg.assistant')].at(-1);
    if (window.__t0 && el && el.rawText) { window.__t1 = performance.now(); observer.disconnect(); }
  }).observe(document.querySelector('#messages'), {childList: true, subtree: true});
}"""
LAST = """() => { const el = [...document.querySelectorAll('.msg.assistant')].at(-1);
  return el ? {status: el.dataset.status, text: el.rawText || ''} : null; }"""


def median(values: list[float]) -> float:
    return round(statistics.median(values), 1) if values else float("nan")


def api_first_token_ms(client: httpx.Client) -> tuple[float, float]:
    """(ms from creating the chat, ms from sending the message) to the first token event."""
    created = time.perf_counter()
    chats = ChatClient(client)
    run = chats.send(chats.new_chat(), SHORT)
    assert run.ttft_s is not None, "no token"
    first = run.started + run.ttft_s
    return (first - created) * 1000, run.ttft_s * 1000


def wait_answer(page: Any, ok: Any, timeout_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        last = page.evaluate(LAST)
        if last and ok(last):
            return dict(last)
        time.sleep(0.02)
    raise TimeoutError(f"answer stuck at {page.evaluate(LAST)}")


def finished(a: dict[str, Any]) -> bool:
    return a["status"] in ("done", "stopped", "refused", "error")


def page_first_token_ms(page: Any) -> float:
    page.click("#new-chat")
    page.wait_for_selector(".empty")
    page.evaluate(TIMER)
    page.fill("#composer-input", SHORT)
    page.press("#composer-input", "Enter")
    wait_answer(page, finished)
    t0, t1 = page.evaluate("() => [window.__t0, window.__t1]")
    assert t0 and t1, "no token drawn"
    return float(t1 - t0)


def reload_ms(page: Any, at_least: str) -> float:
    started = time.perf_counter()
    page.reload()
    wait_answer(page, lambda a: len(a["text"]) >= max(1, len(at_least)))
    return (time.perf_counter() - started) * 1000


def bundle() -> dict[str, int]:
    dist = ROOT / "web" / "dist"
    sizes: dict[str, int] = {}
    for kind in ("js", "css"):
        [path] = [p for p in dist.glob(f"*.{kind}")]
        data = path.read_bytes()
        sizes[f"{kind}_bytes"] = len(data)
        sizes[f"{kind}_gzip_bytes"] = len(gzip.compress(data, 9))
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--reloads", type=int, default=5)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    stack = Stack(namespace=f"b{uuid.uuid4().hex[:8]}", port_base=PORT_BASE, replicas=1)
    stack.up()
    try:
        user = f"bench-web-{uuid.uuid4().hex[:6]}"
        token = credential(user, "pro", 3600)
        client = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.goto(f"{stack.api_url}/#token={token}")
            page.wait_for_selector("#app:not([hidden])")
            api_first_token_ms(client)  # warm both paths once
            page_first_token_ms(page)
            api_ms, post_ms, page_ms = [], [], []
            for i in tqdm(range(args.rounds), desc="first token (API, page)"):
                if i % 2:  # alternate which goes first
                    page_ms.append(page_first_token_ms(page))
                    api = api_first_token_ms(client)
                else:
                    api = api_first_token_ms(client)
                    page_ms.append(page_first_token_ms(page))
                api_ms.append(api[0])
                post_ms.append(api[1])
            running_ms, finished_ms = [], []
            for _ in tqdm(range(args.reloads), desc="reload (running, finished)"):
                page.click("#new-chat")
                page.fill("#composer-input", LONG)
                page.press("#composer-input", "Enter")
                before = wait_answer(page, lambda a: a["status"] == "streaming" and len(a["text"]) >= 40)
                running_ms.append(reload_ms(page, before["text"]))
                done = wait_answer(page, finished)
                finished_ms.append(reload_ms(page, done["text"]))
            browser.close()
        deltas = [p - a for a, p in zip(api_ms, page_ms, strict=True)]
        result = {
            "rounds": args.rounds,
            "first_token_ms": {
                "api_client_median": median(api_ms),
                "api_client_message_only_median": median(post_ms),
                "page_median": median(page_ms),
                "page_minus_api_median": median(deltas),
                "ratio_of_medians": round(median(page_ms) / median(api_ms), 2),
            },
            "reload": {
                "reloads": args.reloads,
                "running_answer_shown_again_ms_median": median(running_ms),
                "finished_answer_shown_ms_median": median(finished_ms),
                "ratio_of_medians": round(median(running_ms) / median(finished_ms), 2),
            },
            "bundle": bundle(),
            "note": "Chromium and the whole stack share this machine's cores; compare within the run.",
        }
        print(json.dumps(result, indent=2))
        (ROOT / "bench" / "results" / "frontend.json").write_text(json.dumps(result, indent=2) + "\n")
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
