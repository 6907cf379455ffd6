"""The edge's error mapping: what a client gets when a backing store or the log does not answer."""

import pytest
from cassandra import ConsistencyLevel, OperationTimedOut, WriteTimeout
from cassandra.cluster import NoHostAvailable
from confluent_kafka import KafkaError, KafkaException
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api import errors

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
