"""`parley runs show RUN_ID` as lines a person reads: each event of the run's history (storage/history.py) with
its time from the first, where it sits in the log, and what it says; then what the stores hold of it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from storage.history import History


def text(history: History) -> str:
    """The history as lines a person reads: time from the first event, where it sits, what it says."""
    data = history.as_json()
    events = data["events"]
    if not events:
        return f"run {history.run_id}: no events"
    start = datetime.fromisoformat(events[0]["time"].replace("Z", "+00:00"))
    lines = [f"run {history.run_id}  chat {history.chat_id}  trace {history.trace_id}"]
    for e in events:
        offset = (
            datetime.fromisoformat(e["time"].replace("Z", "+00:00")) - start
        ).total_seconds() * 1000
        where = f"{e['topic']}[{e['partition']}]@{e['offset']}"
        lines.append(f"{offset:+9.0f} ms  {where:42} {e['type']:16} {_summary(e)}")
    for row in data["stored"].get("messages", []):
        lines.append(
            f"  stored {row['role']:9} {row['message_id']}  {(row['content'] or '')[:80]!r}"
        )
    usage = data["stored"].get("usage")
    if isinstance(usage, list):
        for row in usage:
            lines.append(
                f"  metered {row['prompt_tokens']}+{row['completion_tokens']} tokens, {row['finish_reason']}, "
                f"${row['cost_usd']}"
            )
    elif usage:
        lines.append(f"  metered: {usage}")
    return "\n".join(lines)


def _summary(e: dict[str, Any]) -> str:
    kind = e["type"]
    if kind == "PromptAccepted":
        asked = f" model {e['model']}" if e.get("model") else ""
        given = "".join(
            f"; {i['source']} instructions {i['content'][:40]!r}"
            for i in e.get("instructions") or []
        )
        after = f" after {e['parent_id']}" if e.get("parent_id") else ""
        return f"{e['user_id']} ({e['tier']}){asked}{after}: {e['content'][:60]!r}{given}"
    if kind == "PromptModerated":
        scores = ", ".join(f"{k} {v:.2f}" for k, v in sorted((e.get("scores") or {}).items()))
        return f"{e['decision']} {e['action'] or ''} policy {e['policy_version']} [{scores}]"
    if kind == "RunScheduled":
        ctx = e.get("context") or {}
        return (
            f"pool {e['pool']} model {e['model']} prompt {ctx.get('prompt_tokens', '?')} tokens "
            f"(summary {ctx.get('summary_version') or 'none'}, {len(ctx.get('verbatim_ids', []))} verbatim, "
            f"{len(ctx.get('retrieved_ids', []))} recalled, instructions "
            f"{'+'.join(ctx.get('instructions') or []) or 'none'} {ctx.get('instruction_tokens', 0)} tokens, "
            f"memories {'; '.join(repr(m[:40]) for m in ctx.get('memories') or []) or 'none'}"
            f"{', withheld ' + ' '.join(ctx['withheld_ids']) if ctx.get('withheld_ids') else ''})"
        )
    if kind == "TokenDelta":
        if e.get("kind") == "deltas":
            return f"{e['count']} deltas until {e['last_time']}: {e['text'][:60]!r}"
        if calls := e.get("tool_calls"):
            return "tool calls " + ", ".join(
                f"{c['function']['name']}({c['function']['arguments'][:60]})" for c in calls
            )
        if use := e.get("tool_result"):
            return f"tool {use['name']} {use['status']} in {use['duration_ms']:.0f} ms: {use['content'][:60]!r}"
        return str(e.get("kind"))
    if kind == "RunCompleted":
        usage = e["usage"]
        return (
            f"{e['finish_reason']} {usage['prompt_tokens']}+{usage['completion_tokens']} tokens, "
            f"TTFT {e['ttft_ms']:.0f} ms, ITL p50 {e['itl_p50_ms']:.0f} ms, by {e['served_by']}"
        )
    if kind == "RunRejected":
        return f"{e['code']}: {e['message']}"
    if kind == "OutputModerated":
        return (
            f"{e['action'] or 'passed'} over {e['windows']} windows, policy {e['policy_version']}"
        )
    return ""
