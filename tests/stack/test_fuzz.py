"""Schemathesis against the live edge, from the OpenAPI document it serves: every phase (the document's
examples, boundary values, random and invalid input, and stateful sequences that follow its links: create a
chat -> send a message -> resume, cancel, regenerate, edit or rate the answer -> delete). Every response must
be no 5xx, of the documented content type and schema, and consistent with its neighbours (a deleted chat is
gone, a credential is required).

Left out: the admin routes (a fuzzed admin would rewrite the tiers' limits under the tests that follow), and
the `positive_data_acceptance` check, which counts as a defect every refusal of input the schema cannot
describe: an opaque cursor that was never issued, a report window over 92 days, an OpenAI conversation
whose last message is not the user's."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runtime.settings import REPO_ROOT

from .test_admission import set_limits

ID = "[0-9a-f-]{36}"
RUN_SCOPED = re.compile(rf"^/v1/chats/{ID}/(runs/{ID}/(events|cancel|regenerate)|messages/{ID}(/feedback)?)$")


def fuzz(live, token: str, har: Path, cwd: Path, *args: str) -> None:
    """One run of the schemathesis CLI against the live edge; fails the test on any finding."""
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        f"{live.url}/openapi.json",
        "--header",
        f"Authorization: Bearer {token}",
        "--checks",
        "all",
        "--exclude-checks",
        "positive_data_acceptance",
        "--exclude-path-regex",
        "^/v1/admin/",
        "--request-timeout",
        "120",
        "--no-color",
        "--report",
        "har",
        "--report-har-path",
        str(har),
        *args,
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.stack.fuzz_hooks", "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    summary = result.stdout[result.stdout.find("SUMMARY") - 40 :] if "SUMMARY" in result.stdout else result.stdout
    print(summary[-3000:], result.stderr[-2000:])
    assert result.returncode == 0, result.stdout[-8000:]


def test_fuzzing_the_live_edge_finds_no_server_error_and_nothing_undocumented(live, tmp_path: Path):
    # one person per run: a run that lists its person's chats may delete them, under the other's sequences
    tokens = []
    for _ in range(2):
        user = f"fuzz-{uuid.uuid4().hex[:6]}"
        set_limits(live, user, budget_tokens=10**9, refill_tokens_per_hour=10**9, max_concurrent=64)
        tokens.append(live.token(user))
    # Every phase over every operation, and beside it the stateful phase alone over the chat routes, where the
    # links are (alone, its sequences go deeper: a chat, a message, then its answer's run). The two run at once,
    # each with its own time budget: the edge spends most of a request waiting on the stores and the engines.
    everything, chats = tmp_path / "all.har.json", tmp_path / "chats.har.json"
    (tmp_path / "all").mkdir()
    (tmp_path / "chats").mkdir()
    # the routes on the way from a chat to its runs, so the 60 s go deep rather than wide (the other run has
    # every operation): chats, their messages, a message's feedback, a run's events, cancel and regenerate
    deep = r"^/v1/chats(/\{[^}]+\}(/messages(/\{[^}]+\}(/feedback)?)?|/runs/\{[^}]+\}/[a-z]+)?)?$"
    stateful = ("--phases", "stateful", "--include-path-regex", deep, "--max-time", "60")
    with ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(
                fuzz, live, tokens[0], everything, tmp_path / "all", "--max-examples", "25", "--max-time", "100"
            ),
            pool.submit(fuzz, live, tokens[1], chats, tmp_path / "chats", *stateful),
        ]
        for run in runs:
            run.result()

    # The stateful phase really followed the links: answers of real runs were resumed, cancelled, rated...
    entries = [e for har in (everything, chats) for e in json.loads(har.read_text())["log"]["entries"]]
    reached = Counter(
        (e["request"]["method"], e["response"]["status"])
        for e in entries
        if RUN_SCOPED.match(e["request"]["url"].split("?")[0].removeprefix(live.url))
    )
    print(f"{len(entries)} requests; on real runs and answers: {dict(reached)}")
    assert sum(n for (_, status), n in reached.items() if status < 300 or status == 409) >= 1, reached
    for folder in ("all", "chats"):
        shutil.rmtree(tmp_path / folder / "schemathesis-report", ignore_errors=True)
