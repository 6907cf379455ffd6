"""Bad input and bad credentials: clear OpenAI-shaped 4xx, and nothing written."""

import time

from topics import codec
from topics.errors import PoisonEvent
from topics.pipeline import PROMPT_ACCEPTED

from .conftest import read_topic


def assert_error(response, status, code=None):
    assert response.status_code == status, response.text
    err = response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code:
        assert err["code"] == code


def test_credentials(live):
    anon = live.client()
    assert_error(anon.get("/v1/chats"), 401, "missing_token")
    assert_error(live.client("garbage").get("/v1/chats"), 401, "invalid_token")
    expired = live.token(ttl=-10)
    assert_error(live.client(expired).get("/v1/chats"), 401, "expired_token")


def test_another_users_chat_is_404(live):
    alice, bob = live.client(live.token("alice-x")), live.client(live.token("bob-x"))
    chat = alice.post("/v1/chats").json()
    assert_error(bob.get(f"/v1/chats/{chat['id']}/messages"), 404, "chat_not_found")
    assert_error(bob.post(f"/v1/chats/{chat['id']}/messages", json={"content": "hi"}), 404, "chat_not_found")
    assert chat["id"] not in [c["id"] for c in bob.get("/v1/chats").json()["data"]]


def test_bad_input_writes_nothing(live):
    client = live.client(live.token())
    chat = client.post("/v1/chats").json()
    url = f"/v1/chats/{chat['id']}/messages"
    assert_error(
        client.post(url, content=b'{"content": ', headers={"content-type": "application/json"}), 400, "invalid_json"
    )
    assert_error(client.post(url, json={"content": "   "}), 400, "empty_content")
    assert_error(client.post(url, json={"content": "x" * 40_000}), 400, "content_too_long")
    assert_error(client.post(url, json={"content": "hi", "max_tokens": 0}), 400)
    assert_error(client.post(url, json={"content": "hi", "max_tokens": 10**9}), 400)
    assert_error(client.post(url, json={"content": "hi", "max_tokens": "5"}), 400)  # not coerced (schemathesis)
    assert_error(client.post(url, json={"content": "hi", "model": "gpt-9"}), 400, "model_not_found")
    assert_error(client.post(url, json={"text": "hi"}), 400)
    assert_error(
        client.post("/v1/chats/00000000-0000-1000-8000-000000000000/messages", json={"content": "hi"}),
        404,
        "chat_not_found",
    )
    assert_error(client.get("/v1/chats", params={"limit": 0}), 400)
    assert_error(client.get("/v1/chats", params={"cursor": "%%%"}), 400, "invalid_cursor")
    time.sleep(1)
    assert client.get(url).json()["data"] == []

    def for_chat(msg) -> bool:
        try:
            return codec.decode("PromptAccepted", msg.value())["chat_id"] == chat["id"]
        except PoisonEvent:
            return False

    assert not read_topic(live.topic(PROMPT_ACCEPTED), for_chat, timeout_s=5)
