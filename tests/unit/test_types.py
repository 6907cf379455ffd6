"""The typed contract is enforced where the suite runs, not only in `make check`: mypy --strict over every
package (pyproject's [tool.mypy]) passes, and the same run refuses a probe that builds an event without a
required field, publishes an event to another topic's type, gives an enum field a value its schema lacks, or
changes a field of an event it was handed (events are read-only: a changed copy is a new dict)."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
from processors.stage import Stage
from topics.events import PromptAccepted, PromptModerated
from topics.pipeline import PROMPT_MODERATED, RUN_COMPLETED


async def probe(stage: Stage, prompt: PromptAccepted) -> None:
    missing: PromptModerated = {"event_id": "e", "prompt": prompt, "moderated_at": 1}
    ok: PromptModerated = {"event_id": "e", "prompt": prompt, "decision": "allowed", "moderated_at": 1}
    await stage.publish(PROMPT_MODERATED, missing)
    await stage.publish(RUN_COMPLETED, ok)
    await stage.publish(PROMPT_MODERATED, {**ok, "decision": "maybe"})
    prompt["content"] = "changed after the fact"
"""


def test_mypy_passes_on_the_packages_and_refuses_ill_typed_events(tmp_path):
    probe = tmp_path / "typing_probe.py"
    probe.write_text(PROBE)
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["packages"]
    argv = [sys.executable, "-m", "mypy", "-m", "typing_probe", *(f"-p{package}" for package in packages)]
    env = {**os.environ, "MYPYPATH": str(tmp_path)}  # the probe is a module beside the packages, checked with them
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    # mypy's cache may name the probe by an earlier run's folder: it is matched by its file name
    assert errors and all(f"/{probe.name}:" in line for line in errors), done.stdout  # the packages are clean
    lines = sorted(int(line.split(f"{probe.name}:")[1].split(":")[0]) for line in errors)
    assert 'Missing key "decision"' in done.stdout and lines == [8, 11, 12, 13], done.stdout
    assert 'ReadOnly TypedDict key "content" TypedDict is mutated' in done.stdout, done.stdout
