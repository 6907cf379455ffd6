"""OpenAI-compatible `POST /v1/embeddings`, served by the encoder the platform runs (all-MiniLM-L6-v2, 384
dimensions, unit length) in the metering stage, one batch per request, metered to the person
(processors/embeddings.py). The edge checks the request and shapes the answer as OpenAI does: float lists, or
base64 of little-endian float32 as the official client asks for by default."""

from __future__ import annotations

import base64
from typing import Any, Literal
from urllib.parse import quote

import httpx
import numpy as np
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from api.auth import CurrentUser
from api.deps import HttpDep, SettingsDep
from api.errors import ApiError

router = APIRouter()

MODEL = "all-minilm-l6-v2"
DIMENSIONS = 384
MAX_INPUTS = 256
MAX_INPUT_CHARS = 8192


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    input: str | list[str] | list[int] | list[list[int]]
    model: str
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, strict=True)


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class Embeddings(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


def texts_of(body: EmbeddingsRequest) -> list[str]:
    if body.model != MODEL:
        raise ApiError(
            400, f"Unknown embedding model '{body.model}'; this one is {MODEL}.", "model_not_found"
        )
    if body.dimensions not in (None, DIMENSIONS):
        message = f"{MODEL} gives {DIMENSIONS} dimensions; it cannot shorten them."
        raise ApiError(400, message, "invalid_value", "dimensions")
    texts = [body.input] if isinstance(body.input, str) else body.input
    if not texts or not all(isinstance(t, str) for t in texts):
        message = "input is a text or a list of texts (token arrays are not accepted)."
        raise ApiError(400, message, "invalid_value", "input")
    strings = [str(t) for t in texts]
    if len(strings) > MAX_INPUTS:
        raise ApiError(400, f"input takes at most {MAX_INPUTS} texts.", "invalid_value", "input")
    for i, text in enumerate(strings):
        if not text.strip() or len(text) > MAX_INPUT_CHARS:
            message = (
                f"input[{i}] must be a non-empty text of at most {MAX_INPUT_CHARS} characters."
            )
            raise ApiError(400, message, "invalid_value", "input")
    return strings


def encoded(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()


@router.post("/v1/embeddings", response_model=Embeddings)
async def embeddings(
    settings: SettingsDep, http: HttpDep, user: CurrentUser, body: EmbeddingsRequest
) -> Embeddings:
    """Vectors of up to 256 texts (each at most 256 tokens: a longer one is a 400, not cut short), in order."""
    texts = texts_of(body)
    url = f"{settings.metering_url}/embeddings/{quote(user.user_id, safe='')}"
    try:
        response = await http.post(
            url,
            json={"input": texts, "tier": user.tier},
            headers=settings.internal_headers(),
            timeout=60,
        )
    except httpx.HTTPError as exc:
        raise ApiError(
            503,
            "Embeddings are unavailable right now; try again shortly.",
            "embeddings_unavailable",
        ) from exc
    served: dict[str, Any] = response.json() if response.status_code in (200, 400) else {}
    if response.status_code == 400:
        raise ApiError(400, served["error"], "context_length_exceeded", "input")
    if response.status_code != 200:
        raise ApiError(
            503,
            "Embeddings are unavailable right now; try again shortly.",
            "embeddings_unavailable",
        )
    data = [
        Embedding(index=i, embedding=encoded(v, body.encoding_format))
        for i, v in enumerate(served["vectors"])
    ]
    tokens = served["prompt_tokens"]
    return Embeddings(
        data=data, model=MODEL, usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens)
    )
