"""Cancel is an event: the engine stops between decode steps, the partial answer is stored and metered."""

from replay.client import ChatClient
from topics import codec
from topics.pipeline import RUN_COMPLETED, RUN_CONTROL

from ..sse import shown
from .conftest import chat_turn, for_run, read_topic, wait_for

LONG = "Write a very long, detailed story about a lighthouse keeper and the sea."


def test_cancel_mid_stream_stops_the_run_and_keeps_the_partial_answer(live):
    client = live.client(live.token())
    chat = client.post("/v1/chats").json()
    answers = []

    def cancel_now(run):
        answers.append(chats.cancel(chat["id"], run.run_id))  # and keep reading to the end of the stream

    chats = ChatClient(client)
    streamed = chats.send(chat["id"], LONG, max_tokens=400, when=lambda r: r.tokens >= 3, then=cancel_now)
    assert streamed.status == 200
    events, run_id = streamed.events, streamed.run_id
    cancelled = answers[0] if answers else None
    assert cancelled is not None and cancelled.status_code == 202, cancelled and cancelled.text
    done = events[-1]
    assert done["event"] == "run.completed" and done["data"]["finish_reason"] == "cancelled"
    usage = done["data"]["usage"]
    assert 0 < usage["completion_tokens"] < 400 and usage["prompt_tokens"] > 0
    text = shown(events)

    # the control event is on the log, and the run's RunCompleted says cancelled with the streamed text
    control = read_topic(live.topic(RUN_CONTROL), for_run("RunControl", run_id))
    assert len(control) == 1 and codec.decode("RunControl", control[0].value())["action"] == "cancel"
    completed = read_topic(live.topic(RUN_COMPLETED), for_run("RunCompleted", run_id))
    record = codec.decode("RunCompleted", completed[0].value())
    assert record["finish_reason"] == "cancelled" and record["content"] == text

    def stored():
        data = client.get(f"/v1/chats/{chat['id']}/messages").json()["data"]
        return data[1] if len(data) == 2 else None

    answer = wait_for(stored)
    assert answer and answer["content"] == text and answer["finish_reason"] == "cancelled"
    rows = wait_for(lambda: live.usage_rows(run_id))
    assert rows and int(rows[0]["completion_tokens"]) == usage["completion_tokens"]
    assert rows[0]["finish_reason"] == "cancelled"

    # cancelling a finished run is a conflict
    again = client.post(f"/v1/chats/{chat['id']}/runs/{run_id}/cancel")
    assert again.status_code == 409 and again.json()["error"]["code"] == "run_already_finished"


def test_cancel_errors(live):
    alice, bob = live.client(live.token()), live.client(live.token())
    chat = alice.post("/v1/chats").json()
    run_id = chat_turn(alice, chat["id"], "Hi", max_tokens=4)[0]["data"]["run_id"]
    url = f"/v1/chats/{chat['id']}/runs/{run_id}/cancel"
    assert bob.post(url).status_code == 404, "another user's run: 404, never 403"
    assert alice.post(f"/v1/chats/{chat['id']}/runs/not-a-run/cancel").status_code == 404
    assert wait_for(lambda: alice.post(url).status_code == 409)


def test_closing_the_connection_does_not_cancel(live):
    client = live.client(live.token())
    chat = client.post("/v1/chats").json()
    # the first event, then hang up
    run_id = ChatClient(client).send(chat["id"], LONG, max_tokens=48, when=lambda r: True, then=lambda r: True).run_id

    def stored():
        data = client.get(f"/v1/chats/{chat['id']}/messages").json()["data"]
        return data[1] if len(data) == 2 else None

    answer = wait_for(stored, timeout_s=60)
    assert answer and answer["id"] == run_id and answer["finish_reason"] in ("stop", "length")
