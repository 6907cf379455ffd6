"""MiniLM's encoder (safety/encoder.py's graph) written in JAX, so bench/safety_finetune.py can train its layers."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from safety.encoder import DIM, EPS, HEAD_DIM, HEADS, LAYERS

Params = dict[str, Any]


def _norm(x: jax.Array, p: Params, name: str) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + EPS) * p[f"{name}.weight"] + p[f"{name}.bias"]


def _linear(x: jax.Array, p: Params, name: str) -> jax.Array:
    return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]


def encode(p: Params, words: jax.Array, ids: jax.Array, mask: jax.Array) -> jax.Array:
    """safety/encoder.py's graph: [batch, seq] ids and mask -> unit-length mean-pooled embeddings."""
    batch, seq = ids.shape
    x = words[ids] + p["embeddings.position_embeddings.weight"][:seq] + p["embeddings.token_type_embeddings.weight"][0]
    x = _norm(x, p, "embeddings.LayerNorm")
    bias = (1.0 - mask[:, None, None, :]) * -10000.0
    for i in range(LAYERS):
        name = f"encoder.layer.{i}"

        def split(z: jax.Array) -> jax.Array:
            return z.reshape(batch, seq, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)

        q, k, v = (split(_linear(x, p, f"{name}.attention.self.{n}")) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(HEAD_DIM) + bias
        context = (jax.nn.softmax(scores, -1) @ v).transpose(0, 2, 1, 3).reshape(batch, seq, DIM)
        x = _norm(_linear(context, p, f"{name}.attention.output.dense") + x, p, f"{name}.attention.output.LayerNorm")
        hidden = jax.nn.gelu(_linear(x, p, f"{name}.intermediate.dense"), approximate=False)
        x = _norm(_linear(hidden, p, f"{name}.output.dense") + x, p, f"{name}.output.LayerNorm")
    m = mask[:, :, None]
    mean = (x * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)
    return mean / jnp.maximum(jnp.linalg.norm(mean, axis=-1, keepdims=True), 1e-12)
