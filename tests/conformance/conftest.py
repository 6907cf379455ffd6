"""SGLang's own server code, on CPU, for the engine client's conformance (`make test-sglang`).

The server is SGLang's: its HTTP server and OpenAI-compatible routes, tokenizer manager and detokenizer, launched
by its `launch_server` from the pinned wheel (tests/conformance/requirements-sglang.txt) in an environment of its
own. Only the scheduler, the GPU's part, is scripted (tests/conformance/sglang_scheduler.py). The model folder is
made from the bundled SmolLM2 GGUF: its tokenizer and chat template, and SmolLM2-135M's config.

Every exchange the engine client has with the server is recorded, bytes as they came, with what the scheduler
received, under tests/unit/data/sglang/<version>/: the unit tests replay them (tests/unit/test_sglang_wire.py),
so an upgrade of the pin is checked by rerunning this and then the unit tests.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from conversation.tokens import load

ROOT = Path(__file__).resolve().parents[2]
PIN = ROOT / "tests/conformance/requirements-sglang.txt"
MODEL = "smollm2-135m-instruct"
# What the scripted scheduler answers (its tokens, then end of sequence), unless a prompt scripts otherwise.
REPLY = " The lighthouse keeper watched the storm roll in from the sea, and lit the lamp."
CONTEXT = 8192
# SmolLM2-135M-Instruct's config.json: SGLang reads the architecture and the context length from it.
SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": CONTEXT,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
}


def pinned_version() -> str:
    return next(line.split("==")[1].strip() for line in PIN.read_text().splitlines() if line.startswith("sglang=="))


def model_folder(folder: Path) -> Path:
    """A Hugging Face model folder (no weights) from the bundled GGUF's tokenizer and template."""
    chat = load("gguf:")
    folder.mkdir(parents=True, exist_ok=True)
    chat.tokenizer.save(str(folder / "tokenizer.json"))
    template = chat.template_source
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template,
        "bos_token": chat.bos,
        "eos_token": chat.eos,
        "model_max_length": CONTEXT,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    return folder


@dataclass
class Exchange:
    """One HTTP exchange as the client had it: the request, and the response's bytes as they arrived."""

    method: str
    path: str
    body: Any
    sent_at: float
    sent_wall: float = field(default_factory=time.time)
    status: int = 0
    headers_s: float | None = None  # from the request to the response's headers
    first_byte_s: float | None = None  # from the request to the first byte of its body
    content: bytearray = field(default_factory=bytearray)
    ended: bool = False  # the server ended the body (not the client closing it)
    closed_wall: float | None = None  # when the client was done with it (wall clock, as the scheduler's log)

    def json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "path": self.path,
            "body": self.body,
            "status": self.status,
            "headers_s": self.headers_s,
            "first_byte_s": self.first_byte_s,
            "content": self.content.decode(errors="replace"),
            "ended": self.ended,
        }


class _Tee(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, exchange: Exchange) -> None:
        self.inner, self.exchange = inner, exchange

    async def __aiter__(self):  # type: ignore[override]
        async for chunk in self.inner:
            if self.exchange.first_byte_s is None:
                self.exchange.first_byte_s = time.monotonic() - self.exchange.sent_at
            self.exchange.content += chunk
            yield chunk
        self.exchange.ended = True

    async def aclose(self) -> None:
        self.exchange.closed_wall = time.time()
        await self.inner.aclose()


class Recording(httpx.AsyncBaseTransport):
    """httpx's own transport, with every exchange kept."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.exchanges: list[Exchange] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        exchange = Exchange(request.method, request.url.path, body, time.monotonic())
        self.exchanges.append(exchange)
        response = await self.inner.handle_async_request(request)
        exchange.status = response.status_code
        exchange.headers_s = time.monotonic() - exchange.sent_at
        response.stream = _Tee(response.stream, exchange)  # type: ignore[arg-type]
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class Server:
    url: str
    log: Path
    version: str
    model_dir: Path
    out: Path  # where the recordings go

    def scheduler(self, since: float = 0.0) -> list[dict[str, Any]]:
        """What the scripted scheduler received, in order (requests and aborts)."""
        entries = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [e for e in entries if e["t"] >= since]

    def save(self, scenario: str, recording: Recording, scheduler: list[dict[str, Any]], outcome: dict) -> None:
        record = {
            "sglang": self.version,
            "scenario": scenario,
            "exchanges": [e.json() for e in recording.exchanges],
            "scheduler": [{k: v for k, v in e.items() if k != "t"} for e in scheduler],
            "outcome": outcome,
        }
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"{scenario}.json").write_text(json.dumps(record, indent=1) + "\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def sglang(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    python = Path(os.environ.get("PARLEY_SGLANG_PYTHON", ROOT / ".sglang-venv/bin/python"))
    if not python.exists():
        pytest.fail(f"no SGLang environment at {python}: `make test-sglang` makes it")
    tmp = tmp_path_factory.mktemp("sglang")
    folder, log, port = model_folder(tmp / "model"), tmp / "scheduler.jsonl", _free_port()
    log.touch()
    args = ["--model-path", str(folder), "--served-model-name", MODEL, "--context-length", str(CONTEXT)]
    # The chart's flags for an SGLang engine (deploy/helm/parley/templates/inference.yaml), on CPU here.
    args += ["--enable-cache-report", "--enable-priority-scheduling", "--default-priority-value", "0"]
    args += ["--enable-metrics", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "PARLEY_SCRIPTED_LOG": str(log), "PARLEY_SCRIPTED_REPLY": REPLY}
    server_log = open(tmp / "server.log", "w")
    process = subprocess.Popen(
        [str(python), str(ROOT / "tests/conformance/sglang_scheduler.py"), *args],
        env=env,
        stdout=server_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None, (tmp / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "SGLang did not start in 300 s"
            try:
                if httpx.get(f"{url}/health", timeout=10).status_code == 200:  # after its warm-up request
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        query = "import importlib.metadata as m; print(m.version('sglang'))"
        version = subprocess.run([str(python), "-c", query], capture_output=True, text=True, check=True).stdout.strip()
        assert version == pinned_version(), f"the server is SGLang {version}, the pin says {pinned_version()}"
        yield Server(url, log, version, folder, ROOT / "tests/unit/data/sglang" / version)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        server_log.close()
