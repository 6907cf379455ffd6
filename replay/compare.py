"""What changed between a recorded run and its replay (pure): the moderation verdict, and through the whole
pipeline the pool, the prompt's and the answer's tokens, the answer's similarity, TTFT and how it ended; and
the summary over a replay's runs."""

from __future__ import annotations

import difflib
import statistics
from collections import Counter
from collections.abc import Mapping
from typing import Any

from replay.selection import Recorded


def verdict(moderated: Mapping[str, Any] | None) -> dict[str, Any]:
    if moderated is None:
        return {"decision": None, "action": None, "category": None, "policy_version": None}
    keys = ("decision", "action", "category", "policy_version")
    return {k: moderated.get(k) for k in keys} | {"scores": moderated.get("scores") or {}}


def served(
    scheduled: Mapping[str, Any] | None, done: Mapping[str, Any] | None, ended: str | None
) -> dict[str, Any]:
    """What a run's answer was (pure): pool, prompt tokens, the answer, its tokens, TTFT, how it ended."""
    context = (scheduled or {}).get("context") or {}
    usage = (done or {}).get("usage") or {}
    return {
        "pool": (scheduled or {}).get("pool"),
        "model": (done or scheduled or {}).get("model"),
        "prompt_tokens": context.get("prompt_tokens", usage.get("prompt_tokens")),
        "completion_tokens": usage.get("completion_tokens"),
        "ttft_ms": (done or {}).get("ttft_ms"),
        "ended": ended,
        "answer": (done or {}).get("content"),
    }


COMPARED = ("pool", "prompt_tokens", "completion_tokens", "ended")


def compared(
    run: Recorded, now: Mapping[str, Any] | None, replayed: Recorded | None = None
) -> dict[str, Any]:
    """One run's result (pure): the verdict then and now and, when the run went through the whole pipeline
    (`replayed`), what it was served then and now; `changed` names every field that differs."""
    then, new = verdict(run.moderated), verdict(now)
    what = [k for k in ("decision", "action") if then[k] != new[k]]
    out: dict[str, Any] = {
        "run_id": run.prompt["run_id"],
        "chat_id": run.prompt["chat_id"],
        "user_id": run.prompt["user_id"],
        "content": run.prompt["content"][:200],
        "then": then,
        "now": new,
    }
    if replayed is not None:
        was = served(run.scheduled, run.completed, run.ended)
        now_served = served(replayed.scheduled, replayed.completed, replayed.ended)
        out["then"] |= was
        out["now"] |= now_served
        what += [k for k in COMPARED if was[k] != now_served[k]]
        a, b = was["answer"] or "", now_served["answer"] or ""
        out["similarity"] = round(difflib.SequenceMatcher(None, a, b).ratio(), 3) if a or b else 1.0
    out["changed"] = bool(what)
    out["what"] = what
    return out


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts then and now per action, and each kind of flip (pure)."""
    then = Counter(r["then"]["action"] or "none" for r in results)
    now = Counter(r["now"]["action"] or "none" for r in results)

    def said(v: dict[str, Any]) -> str:
        return f"{v['decision']}/{v['action'] or 'none'}"

    moderated = [r for r in results if {"decision", "action"} & set(r.get("what", ()))]
    flips = Counter(f"{said(r['then'])} -> {said(r['now'])}" for r in moderated)
    served: dict[str, Any] = {}
    sims = [r["similarity"] for r in results if "similarity" in r]
    if sims:

        def total(when: str, key: str) -> int:
            return sum(r[when].get(key) or 0 for r in results)

        def median(when: str, key: str) -> float | None:
            found = [r[when][key] for r in results if r[when].get(key)]
            return round(statistics.median(found), 1) if found else None

        served = {
            "fields_changed": dict(Counter(w for r in results for w in r["what"])),
            "answer_similarity_mean": round(sum(sims) / len(sims), 3),
            "completion_tokens": {
                "then": total("then", "completion_tokens"),
                "now": total("now", "completion_tokens"),
            },
            "prompt_tokens": {
                "then": total("then", "prompt_tokens"),
                "now": total("now", "prompt_tokens"),
            },
            "ttft_ms_median": {"then": median("then", "ttft_ms"), "now": median("now", "ttft_ms")},
            "pools": {
                "then": dict(Counter(r["then"].get("pool") for r in results)),
                "now": dict(Counter(r["now"].get("pool") for r in results)),
            },
        }
    return {
        **served,
        "then": dict(then),
        "now": dict(now),
        "changed": sum(r["changed"] for r in results),
        "moderation_changed": len(moderated),
        "flips": dict(flips),
        "newly_blocked": sum(r["now"]["decision"] == "blocked" for r in moderated),
        "newly_allowed": sum(r["now"]["decision"] == "allowed" for r in moderated),
    }
