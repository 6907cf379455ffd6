"""Run one inference consumer: `python -m inference` (settings from PARLEY_* environment variables)."""

from __future__ import annotations

import asyncio
import logging
import signal

from inference.engine import Engine, OpenAIStreamEngine
from inference.settings import InferenceSettings
from inference.worker import Worker
from topics.settings import state_dir


async def amain(settings: InferenceSettings) -> None:
    server = None
    if settings.engine == "llamacpp":
        from inference.llama_server import LlamaServer

        server = LlamaServer(
            port=settings.llama_port,
            slots=settings.slots,
            context=settings.slot_context,
            threads=settings.threads,
            log_path=state_dir() / "logs" / (settings.namespace or "default") / f"llama-server-{settings.pool}.log",
        )
        await asyncio.get_running_loop().run_in_executor(None, server.start)
        engine: Engine = OpenAIStreamEngine("llamacpp", server.url)
    else:
        engine = OpenAIStreamEngine(settings.engine, settings.engine_url)
    worker = Worker(settings, engine)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    try:
        await worker.run()
    finally:
        await engine.aclose()
        if server:
            server.stop()


def main() -> None:
    settings = InferenceSettings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    asyncio.run(amain(settings))


if __name__ == "__main__":
    main()
