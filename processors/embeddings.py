"""Embeddings for the edge's `POST /v1/embeddings`, from the metering stage: the encoder it already runs to keep
search by meaning (all-MiniLM-L6-v2, 384 dimensions, unit length), one batch per request, metered.

Served here, not at the edge: the edge's event loop streams every answer, and a batch of 256 texts is CPU time
that would stall them; the metering stage holds the encoder already, and owns the usage table. The usage row
(kind `embedding`: the tokens the encoder read, no completion) is written before the vectors are returned, so no
vector leaves unmetered. A request is not a run: it has no record on the log, so reconciliation, which rebuilds
runs from the log, leaves these rows out (processors/reconcile.py).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import numpy as np
from faust.web import View
from prometheus_client import Counter

from processors.stage import Stage
from processors.usage_pages import in_thread
from safety.encoder import MAX_TOKENS, Encoder
from storage.clickhouse import iso
from storage.usage import UsageStore
from topics.clock import now_ms

log = logging.getLogger(__name__)
Cost = Callable[
    [str, int, int, int], Decimal
]  # the price table's: model, prompt, cached, completion tokens

MODEL = "all-minilm-l6-v2"
EMBEDDED = Counter(
    "parley_embeddings_inputs_total", "Texts embedded for POST /v1/embeddings", ["outcome"]
)


class TooLong(ValueError):
    def __init__(self, index: int, tokens: int) -> None:
        super().__init__(
            f"input[{index}] is {tokens} tokens; {MODEL} reads at most {MAX_TOKENS}. Shorten it."
        )


def embed(encoder: Encoder, texts: list[str]) -> tuple[np.ndarray, int]:
    """The texts' vectors and the tokens read; raises TooLong for a text past the encoder's window (it would be
    cut without a word, as OpenAI's models refuse it)."""
    counts = encoder.token_counts(texts)
    for i, n in enumerate(counts):
        if n > MAX_TOKENS:
            raise TooLong(i, n)
    return encoder.embed(texts), sum(counts)


def usage_row(user_id: str, tier: str, tokens: int, took_ms: float, cost: Cost) -> dict[str, Any]:
    request_id = str(uuid.uuid4())
    return {
        "run_id": request_id,
        "event_id": request_id,
        "user_id": user_id,
        "tier": tier,
        "chat_id": "",
        "kind": "embedding",
        "model": MODEL,
        "pool": "encoder",
        "prompt_tokens": tokens,
        "completion_tokens": 0,
        "cached_tokens": 0,
        "ttft_ms": 0.0,
        "itl_p50_ms": 0.0,
        "itl_p99_ms": 0.0,
        "queue_ms": 0.0,
        "duration_ms": took_ms,
        "finish_reason": "stop",
        "moderation": "unscreened",
        "cost_usd": str(cost(MODEL, tokens, 0, 0)),
        "created_at": iso(now_ms()),
    }


def serve(
    encoder: Encoder, store: UsageStore, cost: Cost, user_id: str, tier: str, texts: list[str]
) -> dict[str, Any]:
    started = now_ms()
    vectors, tokens = embed(encoder, texts)
    store.write([usage_row(user_id, tier, tokens, float(now_ms() - started), cost)])
    return {"model": MODEL, "vectors": vectors.tolist(), "prompt_tokens": tokens}


def add(stage: Stage, encoder: Encoder, store: UsageStore, cost: Cost) -> None:
    @stage.app.page("/embeddings/{user_id}")
    class Embeddings(View):
        async def post(self, request: Any, user_id: str) -> Any:
            """{"input": [texts], "tier"}: their vectors, metered to the person (the edge checked the input)."""
            stage.require_internal(request)
            body = await request.json()
            texts = [str(t) for t in body["input"]]
            try:
                served = await in_thread(serve, encoder, store, cost, user_id, body["tier"], texts)
            except TooLong as exc:
                EMBEDDED.labels("too_long").inc(len(texts))
                return self.json({"error": str(exc)}, status=400)
            EMBEDDED.labels("embedded").inc(len(texts))
            return self.json(served)
