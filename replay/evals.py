"""`parley eval run SUITE --label L` and `parley eval compare L1 L2`: eval suites through the real pipeline.

A suite is a YAML file of cases; each case is one or several user turns sent through the edge's chat API
(so moderation, scheduling, memory, the engine and output moderation all take part), and checks on the last
turn's answer. Each case's result is a row of ClickHouse's `eval_results` (written through the metering
stage, which owns the usage store), so two labels (two models, two policies, two builds) compare from there.
The moderation verdict of each turn (scores, policy version) is read from the log afterwards.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator
from tqdm import tqdm

from replay.client import ChatClient
from runtime.window import Read, Window
from topics.clock import now_ms
from topics.pipeline import PROMPT_MODERATED

SUITES = Path(__file__).with_name("suites")


class SuiteError(ValueError):
    pass


class Checks(BaseModel):
    """What the last turn must show. Every check named must pass for the case to pass."""

    model_config = {"extra": "forbid", "frozen": True}

    refused: bool | None = None  # True: refused (input block or output retraction)
    not_refused: bool | None = None  # True: answered
    contains: str | None = None  # a substring of the answer, case-insensitive
    regex: str | None = None  # a regular expression that matches somewhere in the answer
    max_tokens: int | None = Field(None, ge=0)  # the answer's completion tokens at most this
    json_valid: bool | None = None  # the answer (or its first {...} / [...] block) parses as JSON
    # a fact planted in an earlier turn, found in the answer (case-insensitive)
    recalls: str | None = None
    max_ttft_ms: float | None = Field(
        None, gt=0
    )  # time to first token at most this, as the client saw it

    @model_validator(mode="after")
    def _some(self) -> Checks:
        if not self.model_dump(exclude_none=True):
            raise ValueError("a case needs at least one check")
        if self.regex is not None:
            re.compile(self.regex)
        return self


class Case(BaseModel):
    model_config = {"extra": "forbid", "frozen": True}

    id: str = Field(min_length=1)
    turns: list[str] = Field(min_length=1)
    max_tokens: int = Field(48, ge=1)
    checks: Checks


class Suite(BaseModel):
    model_config = {"extra": "forbid", "frozen": True}

    suite: str = Field(min_length=1)
    description: str = ""
    cases: list[Case] = Field(min_length=1)


def load(path: str) -> Suite:
    """A suite file, by path or by the name of a shipped suite (replay/suites/NAME.yaml)."""
    found = Path(path)
    if not found.is_file() and (SUITES / f"{path}.yaml").is_file():
        found = SUITES / f"{path}.yaml"
    if not found.is_file():
        shipped = ", ".join(sorted(p.stem for p in SUITES.glob("*.yaml")))
        raise SuiteError(f"no suite {path} (a YAML file, or one of the shipped suites: {shipped})")
    try:
        suite = Suite(**(yaml.safe_load(found.read_text()) or {}))
    except yaml.YAMLError as exc:
        raise SuiteError(f"{found} is not YAML: {exc}") from None
    except (ValidationError, TypeError) as exc:
        raise SuiteError(f"{found} is not a suite: {exc}") from None
    ids = [c.id for c in suite.cases]
    if len(ids) != len(set(ids)):
        raise SuiteError(
            f"{found}: case ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}"
        )
    return suite


@dataclass
class Turn:
    """One turn as the client saw it."""

    run_id: str = ""
    answer: str = ""
    refused: bool = False
    finish_reason: str = ""
    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float = 0.0
    error: str = ""


def _json_in(text: str) -> bool:
    """The answer is JSON, or starts a JSON value at its first brace or bracket (a model may fence it or
    add a sentence around it)."""
    decoder = json.JSONDecoder()
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    for start in [0, *sorted(starts)]:
        try:
            decoder.raw_decode(text.strip() if start == 0 else text[start:])
            return True
        except ValueError:
            continue
    return False


def judged(checks: Checks, turn: Turn) -> dict[str, bool]:
    """Each named check's outcome on the last turn (pure)."""
    answer = turn.answer.lower()
    out: dict[str, bool] = {}
    if checks.refused is not None:
        out["refused"] = turn.refused == checks.refused
    if checks.not_refused is not None:
        out["not_refused"] = (not turn.refused) == checks.not_refused
    if checks.contains is not None:
        out["contains"] = checks.contains.lower() in answer
    if checks.regex is not None:
        out["regex"] = re.search(checks.regex, turn.answer) is not None
    if checks.max_tokens is not None:
        out["max_tokens"] = turn.completion_tokens <= checks.max_tokens
    if checks.json_valid is not None:
        out["json_valid"] = _json_in(turn.answer) == checks.json_valid
    if checks.recalls is not None:
        out["recalls"] = checks.recalls.lower() in answer
    if checks.max_ttft_ms is not None:
        out["max_ttft_ms"] = 0 < turn.ttft_ms <= checks.max_ttft_ms
    return out


def send(
    client: httpx.Client, chat_id: str, content: str, max_tokens: int, model: str | None = None
) -> Turn:
    """One turn through the chat API's stream."""
    body: dict[str, Any] = {"max_tokens": max_tokens} | ({"model": model} if model else {})
    run = ChatClient(client).send(chat_id, content, **body)
    if run.status != 200:
        return Turn(error=f"{run.status}: {json.dumps(run.error)[:200]}")
    done = run.completed or {}
    usage = done.get("usage") or {}
    errors = [e.get("data") for e in run.events if e.get("event") in ("run.error", "error")]
    return Turn(
        answer=run.text,  # what the user was left with: a retracted part is not the answer
        run_id=run.run_id or "",
        ttft_ms=(run.ttft_s or 0.0) * 1000,
        finish_reason=done.get("finish_reason", ""),
        model=done.get("model") or "",
        prompt_tokens=usage.get("prompt_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
        # refused before inference, or part of the answer withdrawn ("retract"), or filtered
        refused="moderation" in run.names or done.get("finish_reason") == "content_filter",
        error=json.dumps(errors[-1])[:200] if errors else "",
    )


@dataclass
class Result:
    label: str
    suite: str
    case: str
    passed: bool
    checks: dict[str, bool]
    turn: Turn
    at_ms: int
    scores: dict[str, float] = field(default_factory=dict)
    policy_version: str = ""

    def row(self) -> dict[str, Any]:
        t = self.turn
        return {
            "label": self.label,
            "suite": self.suite,
            "case": self.case,
            "pass": int(self.passed),
            "checks": json.dumps(self.checks, sort_keys=True),
            "scores": json.dumps(self.scores, sort_keys=True),
            "prompt_tokens": t.prompt_tokens,
            "completion_tokens": t.completion_tokens,
            "ttft_ms": round(t.ttft_ms, 2),
            "model": t.model,
            "policy_version": self.policy_version,
            "run_id": t.run_id,
            "answer": t.answer[:2000],
            "refused": int(t.refused),
            "error": t.error,
            "at": self.at_ms,
        }


def run_suite(
    suite: Suite, label: str, client: httpx.Client, progress: bool = True, model: str | None = None
) -> list[Result]:
    results = []
    for case in tqdm(suite.cases, unit="case", desc=f"eval {suite.suite}", disable=not progress):
        chat = client.post("/v1/chats", json={"title": f"eval {label} {suite.suite}/{case.id}"})
        chat.raise_for_status()
        turn = Turn()
        for content in case.turns:
            turn = send(client, chat.json()["id"], content, case.max_tokens, model)
            if turn.error:
                break
        checks = judged(case.checks, turn)
        passed = not turn.error and all(checks.values())
        results.append(Result(label, suite.suite, case.id, passed, checks, turn, now_ms()))
    return results


def add_verdicts(window: Window, results: list[Result], since_ms: int) -> None:
    """Each case's moderation scores and policy version, from the log's PromptModerated of its last turn."""
    wanted = {r.turn.run_id: r for r in results if r.turn.run_id}
    if not wanted:
        return
    until = now_ms() + 5_000
    for record in window.read([Read(PROMPT_MODERATED, since_ms - 1_000, until)]):
        found = wanted.get(record.event["prompt"]["run_id"])
        if found is not None:
            found.scores = dict(record.event.get("scores") or {})
            found.policy_version = record.event["policy_version"]


def compare(
    a: list[dict[str, Any]], b: list[dict[str, Any]], label_a: str, label_b: str
) -> dict[str, Any]:
    """What flipped between two labels' latest result per (suite, case) (pure)."""

    def latest(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for row in sorted(rows, key=lambda r: str(r["at"])):
            out[(row["suite"], row["case"])] = row
        return out

    la, lb = latest(a), latest(b)
    both = sorted(set(la) & set(lb))
    flipped = [
        {
            "suite": s,
            "case": c,
            label_a: bool(int(la[(s, c)]["pass"])),
            label_b: bool(int(lb[(s, c)]["pass"])),
            "checks": {
                label_a: json.loads(la[(s, c)]["checks"]),
                label_b: json.loads(lb[(s, c)]["checks"]),
            },
        }
        for s, c in both
        if int(la[(s, c)]["pass"]) != int(lb[(s, c)]["pass"])
    ]

    def rate(rows: dict[tuple[str, str], dict[str, Any]]) -> float | None:
        keys = [k for k in both if k in rows]
        return round(sum(int(rows[k]["pass"]) for k in keys) / len(keys), 3) if keys else None

    return {
        "labels": [label_a, label_b],
        "cases": len(both),
        "pass_rate": {label_a: rate(la), label_b: rate(lb)},
        "flipped": flipped,
        "only_in": {
            label_a: sorted(map("/".join, set(la) - set(lb))),
            label_b: sorted(map("/".join, set(lb) - set(la))),
        },
    }


class Store:
    """eval_results through the metering stage's internal pages (it owns the usage store)."""

    def __init__(self, metering_url: str, headers: dict[str, str]) -> None:
        self.http = httpx.Client(base_url=metering_url, headers=headers, timeout=60)

    def write(self, results: list[Result]) -> int:
        response = self.http.post("/eval-results", json={"rows": [r.row() for r in results]})
        response.raise_for_status()
        return int(response.json()["written"])

    def rows(self, label: str) -> list[dict[str, Any]]:
        response = self.http.get("/eval-results", params={"label": label})
        response.raise_for_status()
        return list(response.json()["data"])


def new_label() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:4]
