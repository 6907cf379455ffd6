"""Run one inference consumer: `python -m inference` (settings from PARLEY_* environment variables)."""

from __future__ import annotations

import asyncio
import logging
import signal

from inference.engine import Engine, OpenAIStreamEngine
from inference.settings import InferenceSettings
from inference.worker import Worker
from topics.settings import state_dir


async def amain(settings: InferenceSettings, engine_url: str) -> None:
    engine: Engine = OpenAIStreamEngine(settings.engine, engine_url)
    worker = Worker(settings, engine)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    try:
        await worker.run()
    finally:
        await engine.aclose()


def main() -> None:
    settings = InferenceSettings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if settings.engine != "llamacpp":
        asyncio.run(amain(settings, settings.engine_url))
        return
    from inference.llama_server import LlamaServer

    # Started from the main thread: the child's death signal is tied to the thread that spawned it.
    server = LlamaServer(
        port=settings.llama_port,
        slots=settings.slots,
        context=settings.slot_context,
        threads=settings.threads,
        log_path=state_dir() / "logs" / (settings.namespace or "default") / f"llama-server-{settings.pool}.log",
    )
    server.start()
    try:
        asyncio.run(amain(settings, server.url))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
