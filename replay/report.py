"""A replay's report as text for a terminal and as one self-contained HTML page with plots (inline SVG:
nothing to load, so the page opens anywhere and can be attached to a review)."""

from __future__ import annotations

import html as escape
from typing import Any

BAR_W, BAR_GAP, PLOT_H = 28, 8, 140


def text(found: dict[str, Any]) -> str:
    s = found["summary"]
    lines = [
        f"replay {found['replay_id']} through {found['through']}: {found['runs']} runs, candidate {found['candidate']}",
        f"  moderation actions then {s['then']}, now {s['now']}; {s['moderation_changed']} verdicts and "
        f"{s['changed']} runs changed in all",
    ]
    lines += [f"  {count:5}  {flip}" for flip, count in s["flips"].items()]
    if "answer_similarity_mean" in s:
        lines.append(
            f"  answers: mean similarity {s['answer_similarity_mean']}, completion tokens "
            f"{s['completion_tokens']['then']} -> {s['completion_tokens']['now']}, prompt tokens "
            f"{s['prompt_tokens']['then']} -> {s['prompt_tokens']['now']}, TTFT median "
            f"{s['ttft_ms_median']['then']} -> {s['ttft_ms_median']['now']} ms; fields changed {s['fields_changed']}"
        )
    for r in found["changed"][:20]:
        lines.append(f"  {r['run_id']}  {', '.join(r['what'])}  {r['content'][:60]!r}")
    if found.get("runs_per_s"):
        lines.append(f"  {found['runs_per_s']} runs/s")
    return "\n".join(lines)


def bars(title: str, series: dict[str, dict[str, float]]) -> str:
    """Grouped bars: one group per key, one bar per series (then, now)."""
    keys = sorted({k for values in series.values() for k in values})
    top = max([v for values in series.values() for v in values.values()] or [1]) or 1
    colours = ("#8a8f98", "#2f6fde", "#d9822b")
    group = len(series) * BAR_W + BAR_GAP * 2
    width = max(240, len(keys) * group + 40)
    out = [
        f'<svg width="{width}" height="{PLOT_H + 60}" role="img" aria-label="{escape.escape(title)}">'
    ]
    for gi, key in enumerate(keys):
        x0 = 20 + gi * group
        for si, (name, values) in enumerate(series.items()):
            value = values.get(key, 0)
            h = PLOT_H * value / top
            x, y = x0 + si * BAR_W, 10 + PLOT_H - h
            out.append(
                f'<rect x="{x}" y="{y:.1f}" width="{BAR_W - 4}" height="{h:.1f}" fill="{colours[si % 3]}">'
                f"<title>{escape.escape(name)} {escape.escape(key)}: {value}</title></rect>"
                f'<text x="{x + 2}" y="{y - 2:.1f}" font-size="10">{value:g}</text>'
            )
        out.append(
            f'<text x="{x0}" y="{PLOT_H + 26}" font-size="11">{escape.escape(str(key))[:24]}</text>'
        )
    legend = " ".join(
        f'<tspan fill="{colours[i % 3]}">■ {escape.escape(n)}</tspan>' for i, n in enumerate(series)
    )
    out.append(f'<text x="20" y="{PLOT_H + 50}" font-size="12">{legend}</text></svg>')
    return f"<figure><figcaption>{escape.escape(title)}</figcaption>{''.join(out)}</figure>"


def histogram(values: list[float], buckets: int = 10) -> dict[str, float]:
    counts = {f"{i / buckets:.1f}-{(i + 1) / buckets:.1f}": 0.0 for i in range(buckets)}
    names = list(counts)
    for v in values:
        counts[names[min(buckets - 1, int(v * buckets))]] += 1
    return counts


def html(found: dict[str, Any]) -> str:
    s = found["summary"]
    figures = [bars("Moderation actions", {"then": s["then"], "now": s["now"]})]
    if "answer_similarity_mean" in s:
        figures.append(
            bars("Pools", {"then": _named(s["pools"]["then"]), "now": _named(s["pools"]["now"])})
        )
        figures.append(
            bars(
                "Tokens",
                {
                    "then": {
                        "prompt": s["prompt_tokens"]["then"],
                        "completion": s["completion_tokens"]["then"],
                    },
                    "now": {
                        "prompt": s["prompt_tokens"]["now"],
                        "completion": s["completion_tokens"]["now"],
                    },
                },
            )
        )
        figures.append(
            bars("Answer similarity (runs per bucket)", {"runs": histogram(_similarities(found))})
        )
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{escape.escape(str(v))}</td>"
            for v in (
                r["run_id"],
                r["content"][:80],
                ", ".join(r["what"]),
                f"{r['then']['decision']}/{r['then']['action']}",
                f"{r['now']['decision']}/{r['now']['action']}",
                r.get("similarity", ""),
            )
        )
        + "</tr>"
        for r in found["changed"]
    )
    return f"""<!doctype html><html lang="en"><meta charset="utf-8"><title>Replay {found["replay_id"]}</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}figure{{display:inline-block;margin:1em}}</style>
<h1>Replay {found["replay_id"]}</h1>
<p>Through {found["through"]}; {found["runs"]} runs; candidate <code>{escape.escape(str(found["candidate"]))}</code>;
{s["changed"]} runs changed; {found.get("runs_per_s") or "-"} runs/s.</p>
{"".join(figures)}
<h2>Runs that changed</h2>
<table><tr><th>run</th><th>prompt</th><th>changed</th><th>then</th><th>now</th><th>answer similarity</th></tr>
{rows}</table></html>
"""


def _named(counts: dict[Any, Any]) -> dict[str, float]:
    return {str(k): float(v) for k, v in counts.items()}


def _similarities(found: dict[str, Any]) -> list[float]:
    return [float(v) for v in found.get("similarities", [])]
