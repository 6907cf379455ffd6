"""The pure parts of replay and evals: run ids' times, folding deltas, verdict comparison, checks, label compare."""

from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest

from replay import evals
from replay.candidate import CandidateError, load_policy
from replay.compare import compared, summary
from replay.redrive import settled
from replay.selection import Recorded
from runtime.window import Record
from storage import history
from storage.ids import new_id
from topics.pipeline import PROMPT_ACCEPTED, TOKEN_DELTA


def test_a_run_id_carries_the_time_it_was_minted():
    before = int(time.time() * 1000)
    at = history.minted_ms(str(new_id()))
    assert before - 5 <= at <= int(time.time() * 1000) + 5
    with pytest.raises(ValueError, match="version 1"):
        history.minted_ms(str(uuid.uuid4()))
    with pytest.raises(ValueError, match="not a run id"):
        history.minted_ms("nope")


def _record(topic, offset, ms, event):
    return Record(topic, 0, offset, ms, [], event)


def test_deltas_fold_into_one_entry_in_their_place():
    prompt = {
        "run_id": "r",
        "user_id": "u",
        "tier": "pro",
        "chat_id": "c",
        "message_id": "m",
        "content": "hi",
        "max_tokens": 4,
        "model": None,
        "temperature": None,
        "reply_partition": 0,
        "store": True,
    }
    records = [
        _record(PROMPT_ACCEPTED, 0, 1000, prompt),
        _record(TOKEN_DELTA, 0, 1100, {"run_id": "r", "seq": 0, "kind": "started", "text": ""}),
        _record(TOKEN_DELTA, 1, 1200, {"run_id": "r", "seq": 1, "kind": "delta", "text": "Hel"}),
        _record(TOKEN_DELTA, 2, 1300, {"run_id": "r", "seq": 2, "kind": "delta", "text": "lo"}),
        _record(TOKEN_DELTA, 3, 1400, {"run_id": "r", "seq": 3, "kind": "completed", "text": ""}),
    ]
    events = history.coalesced(records)
    assert [(e["type"], e.get("kind")) for e in events] == [
        ("PromptAccepted", None),
        ("TokenDelta", "started"),
        ("TokenDelta", "deltas"),
        ("TokenDelta", "completed"),
    ]
    folded = events[2]
    assert (folded["count"], folded["text"], folded["offset"], folded["last_offset"]) == (2, "Hello", 1, 2)


def _verdict(decision, action, version="v1"):
    return {
        "decision": decision,
        "action": action,
        "category": "toxic" if action else None,
        "policy_version": version,
        "scores": {"toxic": 0.3},
    }


def test_a_replayed_verdict_is_compared_with_the_recorded_one():
    run = Recorded({"run_id": "r1", "chat_id": "c", "user_id": "u", "content": "x"}, _verdict("allowed", None))
    same = compared(run, _verdict("allowed", None, "v2"))
    flipped = compared(run, _verdict("blocked", "block", "v2"))
    warned = compared(run, _verdict("allowed", "warn", "v2"))
    assert not same["changed"] and flipped["changed"] and warned["changed"]
    report = summary([same, flipped, warned])
    assert report["changed"] == 2 and report["newly_blocked"] == 1
    assert report["flips"] == {"allowed/none -> blocked/block": 1, "allowed/none -> allowed/warn": 1}
    assert report["then"] == {"none": 3} and report["now"] == {"none": 1, "block": 1, "warn": 1}


def test_outcomes_of_a_recorded_run():
    run = Recorded({"run_id": "r"}, _verdict("allowed", "warn"), "completed:content_filter", "down")
    assert run.outcomes() == {"allowed", "warned", "completed", "retracted"}
    assert Recorded({"run_id": "r"}, _verdict("blocked", "block"), "rejected:content_filter").outcomes() == {
        "blocked",
        "rejected",
    }


def test_a_policy_file_that_is_not_a_policy_is_refused(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"version": "x", "rules": [{"stage": "input", "category": "nope"}]}))
    with pytest.raises(CandidateError, match="is not a policy"):
        load_policy(str(bad))
    with pytest.raises(CandidateError, match="no policy file"):
        load_policy(str(tmp_path / "missing.json"))


def test_checks_judge_the_last_turn():
    turn = evals.Turn(answer='Sure: {"name": "Ana", "age": 30}', completion_tokens=12, ttft_ms=80.0)
    checks = evals.Checks(
        json_valid=True, contains="ana", regex=r"\d+", max_tokens=12, not_refused=True, max_ttft_ms=100
    )
    assert all(evals.judged(checks, turn).values())
    refused = evals.Turn(refused=True)
    assert evals.judged(evals.Checks(refused=True, not_refused=False), refused) == {
        "refused": True,
        "not_refused": True,
    }
    assert evals.judged(evals.Checks(recalls="Biscuit", max_tokens=3), turn) == {"recalls": False, "max_tokens": False}
    assert evals.judged(evals.Checks(max_ttft_ms=50), turn) == {"max_ttft_ms": False}
    with pytest.raises(ValueError, match="at least one check"):
        evals.Checks()


def test_shipped_suites_load_and_a_bad_one_is_named(tmp_path):
    for name in ("safety", "memory", "formatting"):
        assert evals.load(name).cases
    twice = tmp_path / "s.yaml"
    twice.write_text(
        "suite: s\ncases:\n- {id: a, turns: [hi], checks: {not_refused: true}}\n"
        "- {id: a, turns: [hi], checks: {not_refused: true}}\n"
    )
    with pytest.raises(evals.SuiteError, match="repeat"):
        evals.load(str(twice))
    with pytest.raises(evals.SuiteError, match="no suite"):
        evals.load(str(tmp_path / "none.yaml"))


def test_labels_compare_by_their_latest_result_per_case():
    def row(case, passed, at):
        return {"suite": "s", "case": case, "pass": passed, "checks": "{}", "at": at}

    a = [
        row("x", 1, "2026-01-01 00:00:00"),
        row("y", 0, "2026-01-01 00:00:00"),
        row("y", 1, "2026-01-02 00:00:00"),
        row("only-a", 1, "2026-01-01 00:00:00"),
    ]
    b = [row("x", 0, "2026-01-03 00:00:00"), row("y", 1, "2026-01-03 00:00:00")]
    report = evals.compare(a, b, "A", "B")
    assert report["cases"] == 2
    assert [(f["case"], f["A"], f["B"]) for f in report["flipped"]] == [("x", True, False)]
    assert report["pass_rate"] == {"A": 1.0, "B": 0.5} and report["only_in"] == {"A": ["s/only-a"], "B": []}


def test_rated_runs_close_in_time_are_read_in_one_window():
    from replay.export import CLUSTER_GAP_MS, windows
    from storage.history import FIND_MS

    assert windows([1_000_000, 1_000_000 + 60_000, 10_000_000]) == [
        (1_000_000 - FIND_MS, 1_060_000 + CLUSTER_GAP_MS),
        (10_000_000 - FIND_MS, 10_000_000 + CLUSTER_GAP_MS),
    ]
    assert windows([]) == []


def test_a_run_through_the_whole_pipeline_is_compared_field_by_field():
    prompt = {"run_id": "r1", "chat_id": "c", "user_id": "u", "content": "hi"}
    scheduled = {"pool": "small", "model": "m", "context": {"prompt_tokens": 40}}
    done = {
        "model": "m",
        "content": "Hello there",
        "ttft_ms": 90.0,
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 40, "completion_tokens": 3},
    }
    then = Recorded(prompt, _verdict("allowed", None), "completed:stop", None, scheduled, done)
    same = Recorded(prompt, _verdict("allowed", None), "completed:stop", None, scheduled, done)
    result = compared(then, same.moderated, same)
    assert not result["changed"] and result["what"] == [] and result["similarity"] == 1.0
    shorter = dict(done, content="Hel", usage={"prompt_tokens": 40, "completion_tokens": 1}, finish_reason="length")
    other = Recorded(
        prompt, _verdict("allowed", None), "completed:length", None, dict(scheduled, pool="large"), shorter
    )
    result = compared(then, other.moderated, other)
    assert result["what"] == ["pool", "completion_tokens", "ended"] and 0 < result["similarity"] < 1
    report = summary([result])
    assert report["moderation_changed"] == 0 and report["flips"] == {}
    assert report["completion_tokens"] == {"then": 3, "now": 1} and report["pools"]["now"] == {"large": 1}


def test_a_replayed_run_is_settled_once_everything_it_is_compared_on_was_read():
    prompt = {"run_id": "r1", "chat_id": "c", "user_id": "u", "content": "hi"}
    run = Recorded(prompt)
    run.add("RunCompleted", {"finish_reason": "stop", "pool": "small"})  # its end read before the rest
    assert not settled(run, pipeline=True) and not settled(run, pipeline=False)
    run.add("PromptModerated", _verdict("allowed", None))
    assert settled(run, pipeline=False) and not settled(run, pipeline=True)  # a completed run was scheduled
    run.add("RunScheduled", {"pool": "small", "context": {"prompt_tokens": 9}})
    assert settled(run, pipeline=True)
    refused = Recorded(prompt, _verdict("allowed", None))
    assert not settled(refused, pipeline=True)
    refused.add("RunRejected", {"code": "over_capacity"})  # refused by the scheduler: no schedule to wait for
    assert settled(refused, pipeline=True)


def test_a_candidate_must_change_something_within_its_reach():
    from replay.candidate import Candidate

    with pytest.raises(CandidateError, match="say what to change"):
        Candidate(through="pipeline")
    with pytest.raises(CandidateError, match="use --through pipeline"):
        Candidate(through="moderation", max_tokens=4)
    candidate = Candidate(through="pipeline", model="m2", temperature=0.0, settings={"recall_k": "2"})
    sent = candidate.prompt({"run_id": "r", "model": None, "temperature": None, "max_tokens": 9})
    assert (sent["model"], sent["temperature"], sent["max_tokens"]) == ("m2", 0.0, 9)
    assert candidate.environment() == {"PARLEY_RECALL_K": "2"}


def test_the_html_report_draws_its_plots():
    from replay import report

    found = {
        "replay_id": "abc",
        "through": "pipeline",
        "runs": 1,
        "candidate": {"max_tokens": 1},
        "runs_per_s": 2.0,
        "changed": [],
        "similarities": [0.5],
        "summary": {
            "then": {"none": 1},
            "now": {"block": 1},
            "changed": 1,
            "moderation_changed": 1,
            "flips": {},
            "answer_similarity_mean": 0.5,
            "pools": {"then": {"small": 1}, "now": {"small": 1}},
            "prompt_tokens": {"then": 4, "now": 4},
            "completion_tokens": {"then": 3, "now": 1},
            "ttft_ms_median": {"then": 1, "now": 2},
            "fields_changed": {},
        },
    }
    page = report.html(found)
    assert page.count("<svg") == 4 and "Replay abc" in page
    assert "block" in page and "0.5-0.6" in page


def test_a_limits_file_names_known_fields_with_valid_values(tmp_path):
    from replay.candidate import load_limits

    good = tmp_path / "limits.json"
    good.write_text(json.dumps({"users": {"alice": {"budget_tokens": 10}}, "tiers": {"free": {"max_concurrent": 1}}}))
    assert load_limits(str(good))["users"]["alice"] == {"budget_tokens": 10}
    for body, message in (
        ({"users": {"alice": {"budget": 10}}}, "unknown fields"),
        ({"users": {"alice": {"budget_tokens": "lots"}}}, "budget_tokens"),
        ({"groups": {}}, "'tiers' and/or 'users'"),
    ):
        good.write_text(json.dumps(body))
        with pytest.raises(CandidateError, match=message):
            load_limits(str(good))


def test_an_eval_turn_is_judged_on_the_answer_the_user_was_left_with():
    """A retraction ("retract", retract_from) cuts the answer as the chat app does; the checks never see the
    withdrawn part, and the turn counts as refused."""

    def sse(*events: tuple[str, dict]) -> str:
        return "".join(
            f"id: t:0:{n}\nevent: {name}\ndata: {json.dumps(data)}\n\n" for n, (name, data) in enumerate(events)
        )

    body = sse(
        ("run.started", {"run_id": "r1", "model": "m"}),
        ("token", {"run_id": "r1", "delta": "Fine \U0001f600. "}),
        ("token", {"run_id": "r1", "delta": "Withdrawn part"}),
        ("moderation", {"run_id": "r1", "action": "retract", "category": "toxic", "retract_from": 8}),
        ("run.completed", {"run_id": "r1", "finish_reason": "content_filter", "model": "m", "usage": {}}),
    )
    edge = httpx.MockTransport(
        lambda _req: httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})
    )
    with httpx.Client(transport=edge, base_url="http://edge") as client:
        turn = evals.send(client, "c1", "hi", 16)
    assert (turn.answer, turn.refused, turn.run_id) == ("Fine \U0001f600. ", True, "r1")
    assert evals.judged(evals.Checks(contains="Withdrawn"), turn) == {"contains": False}
