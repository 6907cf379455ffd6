"""Evals and exports on the real stack (issue 23): a shipped eval suite run twice and compared from ClickHouse,
an eval under a candidate policy run apart, and rated answers exported as data.

Every command is the real CLI (`python -m infra.cli`), against this session's stack."""

from __future__ import annotations

import json
import time

from confluent_kafka.admin import AdminClient

from replay.client import ChatClient

from .conftest import BOOTSTRAP, chat_turn, parley, wait_for


def test_a_shipped_suite_runs_twice_and_the_labels_compare_from_clickhouse(live):
    stamp = int(time.time())
    labels = [f"fmt-a-{stamp}", f"fmt-b-{stamp}"]
    runs = [
        json.loads(parley(live, "eval", "run", "formatting", "--label", label, "--json", "--quiet").stdout)
        for label in labels
    ]
    for label, ran in zip(labels, runs, strict=True):
        assert ran["label"] == label and ran["stored"] == 4
        for row in ran["results"]:
            assert row["run_id"] and row["model"] and row["policy_version"] == "builtin-2" and row["scores"] != "{}"
            assert row["completion_tokens"] > 0 and row["ttft_ms"] > 0
    with live.internal() as metering:
        stored = {label: metering.get("/eval-results", params={"label": label}).json()["data"] for label in labels}
    for label, ran in zip(labels, runs, strict=True):
        assert sorted((r["case"], int(r["pass"]), r["run_id"]) for r in stored[label]) == sorted(
            (r["case"], r["pass"], r["run_id"]) for r in ran["results"]
        )
    compared = json.loads(parley(live, "eval", "compare", *labels, "--json").stdout)
    assert compared["cases"] == 4
    passes = {label: {r["case"]: r["pass"] for r in ran["results"]} for label, ran in zip(labels, runs, strict=True)}
    assert {f["case"] for f in compared["flipped"]} == {
        c for c in passes[labels[0]] if passes[labels[0]][c] != passes[labels[1]][c]
    }
    assert compared["pass_rate"][labels[0]] == round(sum(passes[labels[0]].values()) / 4, 3)
    missing = parley(live, "eval", "compare", labels[0], "no-such-label", check=False)
    assert missing.returncode != 0 and "no results under label" in missing.stderr


def test_an_eval_under_a_candidate_policy_runs_apart_and_leaves_productions_policy(live, tmp_path):
    policy = tmp_path / "block-all.json"
    rules = [{"stage": "input", "category": "toxic", "threshold": 0.0, "action": "block"}]
    policy.write_text(json.dumps({"version": "block-all", "rules": rules}))
    stamp = int(time.time())
    base, strict = f"fmt-base-{stamp}", f"fmt-strict-{stamp}"
    ran = {
        label: json.loads(
            parley(live, "eval", "run", "formatting", "--label", label, *extra, "--json", "--quiet").stdout
        )
        for label, extra in ((strict, ("--policy", str(policy))), (base, ()))
    }
    for row in ran[strict]["results"]:  # every turn refused by the candidate, before any engine
        assert row["refused"] == 1 and row["policy_version"] == "block-all" and row["completion_tokens"] == 0
    for row in ran[base]["results"]:  # production's policy is untouched (what it refuses is the model's and
        assert row["policy_version"] == "builtin-2"  # output moderation's business: not asserted here)
    compared = json.loads(parley(live, "eval", "compare", base, strict, "--json").stdout)
    passed = {r["case"] for r in ran[base]["results"] if r["pass"]}
    assert {f["case"] for f in compared["flipped"]} == passed and compared["pass_rate"][strict] == 0.0
    left = [
        t
        for t in AdminClient({"bootstrap.servers": BOOTSTRAP}).list_topics(timeout=10).topics
        if t.startswith(f"{live.namespace}-eval-")
    ]
    assert not left


def test_rated_answers_export_with_their_context_and_regenerates_become_preference_pairs(live):
    client = live.client(live.token(f"rater-{int(time.time())}", "pro"))
    chat = client.post("/v1/chats").json()["id"]
    chat_turn(client, chat, "I keep a parrot named Kiwi.", max_tokens=8)
    first = chat_turn(client, chat, "Suggest a name for my next bird.", max_tokens=8)
    first_run = next(e["data"]["run_id"] for e in first if e["event"] == "run.completed")

    def rate(run_id: str, rating: str) -> None:
        def stored() -> bool:
            return any(m["id"] == run_id for m in client.get(f"/v1/chats/{chat}/messages").json()["data"])

        wait_for(stored, 20)
        answer = client.post(f"/v1/chats/{chat}/messages/{run_id}/feedback", json={"rating": rating, "comment": "t"})
        assert answer.status_code == 202, answer.text

    rate(first_run, "down")  # a bad answer, then the same question answered again
    regenerated = ChatClient(client).regenerate(chat, first_run, max_tokens=8)
    assert regenerated.status == 200 and regenerated.completed is not None
    second_run = regenerated.run_id
    rate(second_run, "up")
    time.sleep(1)
    out = parley(live, "export", "feedback", "--since", "10m").stdout
    found = [json.loads(line) for line in out.splitlines() if chat in line]
    rated = {r["run_id"]: r for r in found if r["type"] == "rated"}
    assert {rated[first_run]["rating"], rated[second_run]["rating"]} == {"down", "up"}
    for r in rated.values():
        # the context as the model saw it: the system prompt, the earlier turn and its answer, the question
        assert (
            r["messages"][0]["role"] == "system" and r["messages"][-1]["content"] == "Suggest a name for my next bird."
        )
        assert any("Kiwi" in m["content"] for m in r["messages"][1:-1])
        assert r["answer"] and r["model"] and r["pool"] and r["policy_version"] == "builtin-2" and r["comment"] == "t"
    pairs = [r for r in found if r["type"] == "pair"]
    assert [(p["chosen_run_id"], p["rejected_run_id"]) for p in pairs] == [(second_run, first_run)]
    assert pairs[0]["chosen"] == rated[second_run]["answer"] and pairs[0]["rejected"] == rated[first_run]["answer"]
    empty = parley(live, "export", "feedback", "--since", "2020-01-01", "--until", "2020-01-02", check=False)
    assert empty.returncode != 0 and "no rated answer" in empty.stderr
