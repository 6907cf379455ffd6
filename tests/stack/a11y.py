"""axe-core (the npm package the chat app's dev dependencies pin) run in the page under test: WCAG 2.1 A and AA
and axe's best practices. A violation names its rule, its impact and the elements it found."""

from __future__ import annotations

from pathlib import Path

AXE = Path(__file__).resolve().parents[2] / "web" / "node_modules" / "axe-core" / "axe.min.js"
TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]


def violations(page) -> list[dict]:
    """What axe finds on the page as it stands now (its dialogs and states included)."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.add_script_tag(path=str(AXE))
    found = page.evaluate(
        "async (tags) => (await axe.run(document, {runOnly: {type: 'tag', values: tags}})).violations",
        TAGS,
    )
    return [{"rule": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"]][:5]} for v in found]


def assert_clean(page, state: str) -> None:
    found = violations(page)
    assert not found, f"axe found violations in {state}: {found}"
