"""Run one inference consumer: `python -m inference` (settings from PARLEY_* environment variables)."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

from inference.engine import Engine, OpenAIStreamEngine
from inference.settings import InferenceSettings
from inference.worker import Worker
from registry import client as registry
from runtime import keys, logs
from runtime.settings import state_dir

log = logging.getLogger("inference")


async def amain(
    settings: InferenceSettings,
    engine_url: str,
    api_key: str | None,
    revive: Callable[[], Awaitable[bool]] | None,
) -> None:
    engine: Engine = OpenAIStreamEngine(
        settings.engine,
        engine_url,
        api_key,
        slots=settings.slots,
        health_timeout_s=settings.engine_health_timeout_s,
        busy_wait_s=settings.engine_busy_wait_s,
    )
    worker = Worker(settings, engine, revive)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    try:
        await worker.run()
    finally:
        await engine.aclose()


def main() -> None:
    settings = InferenceSettings()
    logs.configure(settings.log_level, settings.log_format)
    registry.connect(settings.schema_registry_url)
    keys.check(settings)
    keys.start(settings, "inference")
    if settings.engine != "llamacpp":  # sglang (GPU) or any OpenAI-style server someone else runs
        key = settings.engine_api_key.get_secret_value() if settings.engine_api_key else None
        asyncio.run(amain(settings, settings.engine_url, key, None))
        return
    from runtime.llama_server import LlamaServer, key_path

    server = LlamaServer(
        port=settings.llama_port,
        slots=settings.slots,
        context=settings.slot_context,
        threads=settings.threads,
        batch=settings.batch,
        kv_cache_type=settings.kv_cache_type,
        prompt_cache_mib=settings.prompt_cache_mib,
        alias=settings.model,
        log_path=state_dir()
        / "logs"
        / (settings.namespace or "default")
        / f"llama-server-{settings.pool}-{settings.llama_port}.log",
        key_file=key_path(settings.namespace, settings.pool, settings.llama_port),
    )
    # Started (and restarted) from the main thread, which also runs the event loop: the child's death signal
    # is tied to the thread that spawned it.
    server.start()

    async def revive() -> bool:
        """Restart our llama-server if it died; True once it answers again."""
        if server.alive():
            return False  # running but not answering (hung or overloaded): nothing to restart
        log.warning(
            "llama-server exited (%s); restarting it", server.process and server.process.returncode
        )
        server.spawn()
        try:
            await asyncio.get_running_loop().run_in_executor(None, server.wait_ready, 60.0)
        except (RuntimeError, TimeoutError):
            log.exception("llama-server did not come back")
            return False
        return True

    try:
        asyncio.run(amain(settings, server.url, server.api_key, revive))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
