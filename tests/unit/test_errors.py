"""The edge's error mapping: what a client gets when a backing store or the log does not answer."""

import pytest
from cassandra import ConsistencyLevel, OperationTimedOut, WriteTimeout
from cassandra.cluster import NoHostAvailable
from confluent_kafka import KafkaError, KafkaException
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError

from api import errors
from api.openai_request import Completion
from api.routes.admin import LimitsPatch
from api.routes.chat_runs import Regenerate
from api.routes.messages import NewMessage
from runtime.keys import KeysUnavailable

RAISED = {
    "timeout": OperationTimedOut({"127.0.0.12:9042": "Connection defunct by heartbeat"}),
    "write": WriteTimeout(
        "Operation timed out",
        consistency=ConsistencyLevel.LOCAL_QUORUM,
        required_responses=2,
        received_responses=1,
        write_type=0,
    ),
    "nohost": NoHostAvailable("Unable to complete the operation against any hosts", {}),
    "log": KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT)),
    "keys": KeysUnavailable("keys.person-keys.v1: not acknowledged in time"),
    "bug": ZeroDivisionError("a bug"),
}


@pytest.fixture(scope="module")
def client():
    app = FastAPI()
    errors.install(app)

    @app.get("/raise/{what}")
    async def fail(what: str) -> None:
        raise RAISED[what]

    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize("what", ["timeout", "write", "nohost"])
def test_a_store_that_does_not_answer_is_a_retryable_503(client, what):
    response = client.get(f"/raise/{what}")
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "5"
    assert response.json()["error"]["code"] == "store_unavailable"
    assert "heartbeat" not in response.text  # the driver's words stay in the log


def test_a_log_that_does_not_acknowledge_is_a_retryable_503(client):
    response = client.get("/raise/log")
    assert (response.status_code, response.json()["error"]["code"]) == (503, "log_unavailable")
    assert response.headers["Retry-After"] == "5"


def test_data_keys_out_of_reach_are_a_retryable_503(client):
    response = client.get("/raise/keys")
    assert (response.status_code, response.json()["error"]["code"]) == (503, "keys_unavailable")
    assert response.headers["Retry-After"] == "5" and "nothing was written" in response.text


def test_anything_else_is_a_500_without_details(client):
    response = client.get("/raise/bug")
    assert response.status_code == 500
    assert "a bug" not in response.text


def test_a_body_over_the_limit_is_refused_before_it_is_parsed_or_authenticated():
    from api.app import create_app
    from api.settings import ApiSettings

    edge = TestClient(create_app(ApiSettings(max_body_bytes=1_000)), raise_server_exceptions=False)
    declared = edge.post("/v1/chats/x/messages", content=b"{" + b" " * 5_000 + b"}")  # no credential at all
    assert declared.status_code == 413
    assert declared.json()["error"]["code"] == "body_too_large"

    def chunks():  # no Content-Length: counted while read
        for _ in range(10):
            yield b" " * 500

    streamed = edge.post("/v1/chat/completions", content=chunks(), headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413
    assert streamed.json()["error"]["code"] == "body_too_large"


def test_a_number_or_boolean_field_takes_no_string_and_no_other_type():
    """The request bodies' numbers and booleans are what the OpenAPI document says: "5" or true as max_tokens
    is refused (schemathesis found "5" accepted), a JSON integer where a float goes is still one."""
    turn = [{"role": "user", "content": "hi"}]
    for bad in ({"max_tokens": "5"}, {"max_tokens": True}, {"max_tokens": 5.5}):
        with pytest.raises(ValidationError):
            NewMessage(content="hi", **bad)
        with pytest.raises(ValidationError):
            Regenerate(**bad)
        with pytest.raises(ValidationError):
            Completion(messages=turn, **bad)
    for bad in ({"stream": "true"}, {"stream": 1}, {"temperature": "1"}, {"max_completion_tokens": "9"}):
        with pytest.raises(ValidationError):
            Completion(messages=turn, **bad)
    with pytest.raises(ValidationError):
        LimitsPatch(max_concurrent="4")
    assert NewMessage(content="hi", max_tokens=5).max_tokens == 5
    assert Completion(messages=turn, temperature=1, stream=True).temperature == 1.0
    assert LimitsPatch(slot_share=1, degrade=False).slot_share == 1.0
