"""The per-task heads over the shared encoder: logistic regressions shipped as plain coefficients (JSON).

safety/train.py writes them (`make safety-heads`); safety/heads/LICENSES.md says what they were trained on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HEADS_DIR = Path(__file__).resolve().parent / "heads"
INPUT_TASKS = ("prompt_injection", "harmful_request", "toxic")
OUTPUT_TASKS = ("harmful_output", "toxic")


@dataclass(frozen=True)
class Head:
    task: str
    weights: np.ndarray
    bias: float

    def score(self, embeddings: np.ndarray) -> float:
        """The highest probability over the rows (the windows of one text); 0 for no rows."""
        if not len(embeddings):
            return 0.0
        z = embeddings.astype(np.float64) @ self.weights + self.bias
        return float(np.max(1.0 / (1.0 + np.exp(-z))))


def load(tasks: tuple[str, ...]) -> dict[str, Head]:
    heads = {}
    for task in tasks:
        raw = json.loads((HEADS_DIR / f"{task}.json").read_text())
        heads[task] = Head(task, np.asarray(raw["weights"], dtype=np.float64), float(raw["bias"]))
    return heads


# Rules complement the models (they never replace them): phrasings that are unambiguous and that a small
# encoder sometimes scores low. A rule hit sets the category's score to 1.0.
RULES: dict[str, tuple[re.Pattern[str], ...]] = {
    "prompt_injection": (
        re.compile(
            r"\b(ignore|disregard|forget)\b.{0,30}\b(previous|prior|above|all)\b.{0,30}\b(instructions|rules|prompts?)\b",
            re.I | re.S,
        ),
    ),
    "harmful_request": (
        re.compile(
            r"\b(how (do i|to|can i)|steps to|instructions for)\b.{0,40}\b(make|build|synthesi[sz]e)\b.{0,30}"
            r"\b(bomb|explosive|nerve agent|bioweapon|meth(amphetamine)?)\b",
            re.I | re.S,
        ),
    ),
}


def rule_hits(text: str, tasks: tuple[str, ...]) -> set[str]:
    return {task for task in tasks for rule in RULES.get(task, ()) if rule.search(text)}
