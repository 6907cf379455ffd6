"""`parley export feedback --since 7d > rated.jsonl`: datasets from production, read from the log.

One line per rated answer: the context exactly as the model saw it (the scheduled run's messages: system
prompt, summary, recalled and verbatim turns, the question), the answer, the rating and its comment, model,
pool and policy version. Answers to the same question (a regenerate keeps the question's id) rated up and
down become preference pairs: {"type": "pair", "messages", "chosen", "rejected"}. The last rating of an
answer counts; a rating taken back drops it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from runtime.window import Read, Window
from storage.history import ENDED_WITHIN_MS, FIND_MS, iso, minted_ms
from topics.pipeline import FEEDBACK, PROMPT_MODERATED, RUN_COMPLETED, RUN_SCHEDULED, Topic

CLUSTER_GAP_MS = 600_000  # rated runs closer than this in time are read in one window


def ratings(window: Window, since_ms: int, until_ms: int) -> dict[str, dict[str, Any]]:
    """The latest rating of each answer (by its run id) given in the range; taken-back ratings dropped."""
    found: dict[str, dict[str, Any]] = {}
    for record in window.read([Read(FEEDBACK, since_ms, until_ms)]):
        event = record.event
        found[event["message_id"]] = {**event, "rated_ms": record.timestamp_ms}
    return {k: v for k, v in found.items() if v["rating"] in ("up", "down")}


def windows(times: list[int]) -> list[tuple[int, int]]:
    """Time ranges that cover every run time, merged where they are close (pure)."""
    spans: list[tuple[int, int]] = []
    for at in sorted(times):
        start, end = at - FIND_MS, at + CLUSTER_GAP_MS
        if spans and start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((start, end))
    return spans


def runs_of(window: Window, run_ids: set[str]) -> dict[str, dict[str, Any]]:
    """Each run's scheduled context, verdict and completion, and every other run answering the same question
    within the windows (regenerates), by run id."""
    times = [minted_ms(r) for r in run_ids]
    found: dict[str, dict[str, Any]] = {}
    for since, until in windows(times):
        topics: tuple[Topic[Any], ...] = (*RUN_SCHEDULED.values(), PROMPT_MODERATED, RUN_COMPLETED)
        for record in window.read([Read(t, since, until + ENDED_WITHIN_MS) for t in topics]):
            event = record.event
            prompt = event["prompt"]
            run = found.setdefault(prompt["run_id"], {"prompt": prompt})
            run[record.topic.schema] = event
    return found


def lines(
    window: Window, since_ms: int, until_ms: int, pairs_only: bool = False
) -> Iterator[dict[str, Any]]:
    rated = ratings(window, since_ms, until_ms)
    if not rated:
        return
    runs = runs_of(window, set(rated))
    by_question: dict[tuple[str, str], list[str]] = {}
    for run_id, run in runs.items():
        by_question.setdefault((run["prompt"]["chat_id"], run["prompt"]["message_id"]), []).append(
            run_id
        )
    for run_id, rating in rated.items():
        answered = runs.get(run_id)
        if answered is None or "RunCompleted" not in answered or pairs_only:
            continue
        yield row(run_id, answered, rating)
    for (chat_id, question), answers in by_question.items():
        ups = [
            a
            for a in answers
            if rated.get(a, {}).get("rating") == "up" and "RunCompleted" in runs[a]
        ]
        downs = [
            a
            for a in answers
            if rated.get(a, {}).get("rating") == "down" and "RunCompleted" in runs[a]
        ]
        for chosen in ups:
            for rejected in downs:
                yield {
                    "type": "pair",
                    "chat_id": chat_id,
                    "question_id": question,
                    "messages": context(runs[chosen]),
                    "chosen": runs[chosen]["RunCompleted"]["content"],
                    "rejected": runs[rejected]["RunCompleted"]["content"],
                    "chosen_run_id": chosen,
                    "rejected_run_id": rejected,
                }


def context(run: dict[str, Any]) -> list[dict[str, str]]:
    """The messages the model was given (the scheduled run's), or the bare question if none was recorded."""
    scheduled = run.get("RunScheduled")
    if scheduled:
        return [{"role": m["role"], "content": m["content"]} for m in scheduled["messages"]]
    return [{"role": "user", "content": run["prompt"]["content"]}]


def row(run_id: str, run: dict[str, Any], rating: dict[str, Any]) -> dict[str, Any]:
    done = run["RunCompleted"]
    moderated = run.get("PromptModerated") or {}
    return {
        "type": "rated",
        "run_id": run_id,
        "chat_id": run["prompt"]["chat_id"],
        "user_id": run["prompt"]["user_id"],
        "question_id": run["prompt"]["message_id"],
        "rating": rating["rating"],
        "comment": rating.get("comment"),
        "rated_at": iso(rating["rated_ms"]),
        "messages": context(run),
        "answer": done["content"],
        "finish_reason": done["finish_reason"],
        "model": done["model"],
        "pool": done["pool"],
        "policy_version": moderated.get("policy_version"),
        "usage": done["usage"],
    }
