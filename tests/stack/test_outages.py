"""Faults on the real stack: a part killed with kill -9 in the middle of a burst of requests. For every request:
answered and stored exactly once, or refused with a clear, retryable error (503 with Retry-After) and absent;
never a 500 or a hang. A stream that the fault broke is resumed from the log and ends once."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import pytest

from infra.processes import LOCAL, sh
from replay.client import ChatClient, Run

from .conftest import wait_for


def service_pid(script: str) -> int:
    found = subprocess.run(["bash", str(LOCAL / script), "pid"], capture_output=True, text=True).stdout.strip()
    assert found.isdigit(), f"{script} is not running"
    return int(found)


class Replicas:
    """A client's way to the edge: one replica, the other when that one does not answer."""

    def __init__(self, live: object, token: str, worker: int) -> None:
        self.clients = [live.client(token, replica) for replica in (0, 1)]
        self.at = worker % 2

    @property
    def client(self) -> httpx.Client:
        return self.clients[self.at]

    def switch(self) -> None:
        self.at = 1 - self.at
        time.sleep(0.2)


# What the scheduler refuses with (a RunRejected event): the prompt is in the log by then, so the chat shows the
# question and the refusal as its answer (processors/persist_turn.py). An edge refusal (503, or 429 shed at the
# door) comes before the log and must leave nothing.
SCHEDULER_REFUSALS = {
    "concurrency_limit_exceeded",
    "token_budget_exceeded",
    "over_capacity",
    "budget_too_small",
    "context_length_exceeded",
}
RETRYABLE = {"concurrency_limit_exceeded", "token_budget_exceeded", "over_capacity"}  # 429s: they say when


@dataclass
class Burst:
    """Clients creating chats and sending turns as fast as they are answered, until stopped."""

    live: object
    token: str
    creators: int = 16
    talkers: int = 3
    chats: list[str] = field(default_factory=list)  # answered 201
    # (chat, question) -> its run; "refused:<code>" (a 429/503/400), "refused late:<code>" (an error event that
    # ended a started stream); or "unknown" (the connection was cut before an answer began)
    sent: dict[tuple[str, str], str] = field(default_factory=dict)
    completed: set[str] = field(default_factory=set)  # runs whose stream ended with run.completed
    broken: dict[str, str] = field(default_factory=dict)  # run -> the last event of a stream that did not end
    refused: list[tuple[int | str, str]] = field(default_factory=list)  # (status, Retry-After) of every refusal
    unclear: list[str] = field(default_factory=list)  # any other answer
    stop: threading.Event = field(default_factory=threading.Event)

    def refuse(self, response: httpx.Response | Run) -> None:
        status = response.status_code if isinstance(response, httpx.Response) else response.status
        self.refused.append((status, response.headers.get("retry-after", "")))
        # a 409 chat_busy: the chat's previous run goes on after its stream broke (one run of a chat at a time)
        busy = status == 409 and "chat_busy" in (
            response.text if isinstance(response, httpx.Response) else str(response.error)
        )
        if not (status in (429, 503) or busy) or not response.headers.get("retry-after"):
            said = response.text[:200] if isinstance(response, httpx.Response) else str(response.error)[:200]
            self.unclear.append(f"{status}: {said}")
        time.sleep(0.2)

    def create(self, worker: int) -> None:
        replicas = Replicas(self.live, self.token, worker)
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                response = replicas.client.post("/v1/chats", json={"title": f"burst {worker}-{n}"})
            except httpx.ConnectError:  # that edge replica is down: a load balancer sends the next one elsewhere
                replicas.switch()
                continue
            except httpx.HTTPError:  # cut off mid-request: not acknowledged, so no promise was made
                continue
            if response.status_code == 201:
                self.chats.append(response.json()["id"])
            else:
                self.refuse(response)

    def talk(self, worker: int) -> None:
        replicas = Replicas(self.live, self.token, worker)
        chat = None
        n = 0
        while not self.stop.is_set():
            try:
                if chat is None:
                    response = replicas.client.post("/v1/chats")
                    if response.status_code != 201:
                        self.refuse(response)
                        continue
                    chat = response.json()["id"]
            except httpx.HTTPError:
                replicas.switch()
                continue
            n += 1
            question = f"Say the word number {worker}-{n}."
            events: list[dict] = []
            try:
                answer = ChatClient(replicas.client).send(chat, question, max_tokens=8)
                if answer.status != 200:
                    # A 429 may come from the scheduler, after the prompt is in the log: then its code
                    self.sent[(chat, question)] = f"refused:{answer.error['error'].get('code') or ''}"
                    self.refuse(answer)
                    continue
                events = answer.events
                if answer.dropped:
                    replicas.switch()  # the stream broke: resumed from the log after the fault
            except httpx.HTTPError:
                replicas.switch()  # no answer at all
            if not events:  # cut off before the answer began: it may or may not have been taken
                self.sent[(chat, question)] = "unknown"
                continue
            run = events[0]["data"]["run_id"]
            self.sent[(chat, question)] = run
            last = events[-1]  # cut off mid-event, only part of it came
            data = last.get("data") if isinstance(last.get("data"), dict) else {}
            if last.get("event") == "error" and data.get("code") in SCHEDULER_REFUSALS:
                # The scheduler decided after the edge's wait (the store was away): the stream had started
                # with run.accepted, and the refusal ends it, with its Retry-After where retrying can help.
                code = data["code"]
                self.sent[(chat, question)] = f"refused late:{code}"
                self.refused.append(("stream", str(data.get("retry_after_s", ""))))
                if code in RETRYABLE and not data.get("retry_after_s"):
                    self.unclear.append(f"{run}: refused {code} mid-stream without retry_after_s: {data}")
            elif last.get("event") == "run.completed":
                self.completed.add(run)
            else:
                self.broken[run] = str(last.get("event"))

    def __enter__(self) -> Burst:
        self.threads = [threading.Thread(target=self.create, args=(i,)) for i in range(self.creators)]
        self.threads += [threading.Thread(target=self.talk, args=(i,)) for i in range(self.talkers)]
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(180)

    def flowing(self) -> None:
        assert wait_for(lambda: len(self.chats) >= 40 and len(self.completed) >= 3, 90), "the burst did not start"

    def check(self) -> None:
        """Every acknowledged request is found exactly once; every refused one is absent."""
        assert not self.unclear, self.unclear[:5]
        client = self.live.client(self.token)

        def missing_chats() -> list[str]:
            try:
                return [c for c in self.chats if client.get(f"/v1/chats/{c}").status_code != 200]
            except httpx.HTTPError:
                return self.chats

        assert wait_for(lambda: not missing_chats(), 120), f"{len(missing_chats())} of {len(self.chats)} chats lost"

        for run in self.broken:  # a broken stream resumes from the log, on any replica, and ends
            chat = next(c for (c, _), r in self.sent.items() if r == run)
            resumed = ChatClient(client).resume(chat, run)
            assert resumed.status == 200
            events = resumed.events
            assert events[-1]["event"] == "run.completed", (run, [e["event"] for e in events][-3:], events[-1]["data"])
            assert sum(e["event"] == "run.completed" for e in events) == 1

        def wrong() -> list[str]:
            found = []
            by_chat: dict[str, list[dict]] = {}
            for (chat, question), run in self.sent.items():
                if chat not in by_chat:
                    by_chat[chat] = client.get(f"/v1/chats/{chat}/messages", params={"limit": 100}).json()["data"]
                stored = by_chat[chat]
                asked = [m for m in stored if m["role"] == "user" and m["content"] == question]
                answered = sum(m["role"] == "assistant" and m["id"] == run for m in stored)
                if run.startswith("refused:") and asked:
                    # Only a refusal the scheduler made (the prompt already in the log) may be in the chat, and
                    # then as the question with that refusal as its one answer: never answered, never twice.
                    code = run.removeprefix("refused:")
                    turns = [m for m in stored if m["role"] == "assistant" and m["run_id"] == asked[0]["run_id"]]
                    refusal = [(m["finish_reason"], m["content"]) for m in turns]
                    if code not in SCHEDULER_REFUSALS or len(asked) > 1 or [r[0] for r in refusal] != [code]:
                        found.append(f"refused ({code}), yet stored {len(asked)} times, answered {refusal}: {question}")
                elif run.startswith("refused late:"):  # its prompt was in the log: stored, refused, once
                    code = run.removeprefix("refused late:")
                    refusal = [
                        m["finish_reason"]
                        for m in stored
                        if asked and m["role"] == "assistant" and m["run_id"] == asked[0]["run_id"]
                    ]
                    if len(asked) != 1 or refusal != [code]:
                        found.append(f"refused late ({code}): stored {len(asked)}x, answered {refusal}: {question}")
                elif run == "unknown" and len(asked) > 1:
                    found.append(f"cut off, and stored {len(asked)} times: {question}")
                elif not run.startswith("refused") and run != "unknown" and (len(asked), answered) != (1, 1):
                    found.append(f"{run}: question stored {len(asked)} times, answer {answered}")
            return found

        assert wait_for(lambda: not wrong(), 120), wrong()[:5]

    def summary(self) -> str:
        refusals = Counter(status for status, _ in self.refused)
        return (
            f"{len(self.chats)} chats and {len(self.sent)} turns acknowledged or refused "
            f"({len(self.completed)} streamed to the end, {len(self.broken)} broken and resumed), "
            f"refusals by status {dict(refusals)}"
        )


def test_a_kill_9_of_cassandra_mid_burst_loses_no_acknowledged_write(live):
    with Burst(live, live.token()) as burst:
        burst.flowing()
        os.kill(service_pid("cassandra.sh"), signal.SIGKILL)  # mid-burst: writes acknowledged a moment ago
        time.sleep(3)  # requests meet the dead store
        sh(LOCAL / "cassandra.sh", "start")  # replays its commit log
        time.sleep(3)  # and serves the burst again
    burst.check()
    print(f"kill -9 of Cassandra mid-burst: {burst.summary()}")


def test_a_kill_9_of_kafka_mid_burst_loses_and_duplicates_nothing(live):
    with Burst(live, live.token(), creators=2) as burst:
        burst.flowing()
        os.kill(service_pid("kafka.sh"), signal.SIGKILL)
        time.sleep(3)
        # an unclean stop makes the broker check every partition's log: minutes on one holding thousands
        sh(LOCAL / "kafka.sh", "start", env={"KAFKA_START_TIMEOUT": "300"})
        time.sleep(5)
    burst.check()
    print(f"kill -9 of Kafka mid-burst: {burst.summary()}")


@pytest.mark.parametrize("victim", ["moderation", "scheduling-1", "persistence", "inference-small-0", "api-1"])
def test_a_kill_9_of_one_process_mid_burst_loses_and_duplicates_nothing(live, victim):
    """One replica of a stage, an inference consumer (with its engine), or an edge replica; the stack then
    starts what is missing, as `parley up` does."""
    with Burst(live, live.token(), creators=2) as burst:
        burst.flowing()
        os.kill(live.stack.pids()[victim], signal.SIGKILL)
        time.sleep(3)
        live.stack.start()
        live.stack.wait_ready()
        time.sleep(3)
    burst.check()
    print(f"kill -9 of {victim} mid-burst: {burst.summary()}")
