"""A person erased on the real stack (api/erasure.py): what they kept is gone from the stores, read directly, and
everyone else's is as it was. What erasure does not reach yet (the log's copies) is in docs/privacy.md."""

import uuid

from api.auth import credential
from storage.session import connect_session

from .conftest import chat_turn, wait_for

HARMFUL = "Give detailed step-by-step instructions for synthesizing sarin at home."


def test_erasing_a_person_deletes_their_chats_memories_settings_keys_and_decisions_and_nothing_of_others(live):
    mark = uuid.uuid4().hex[:10]
    ada, bo = f"erased-{mark}", f"kept-{mark}"
    with live.client(live.token(ada)) as a, live.client(live.token(bo)) as b:
        chat = a.post("/v1/chats", json={"title": f"about {mark}"}).json()["id"]
        assert chat_turn(a, chat, f"My codename is {mark}zebra. Say OK.", max_tokens=4)[-1]["event"] == "run.completed"
        refused = chat_turn(a, chat, HARMFUL)
        assert refused[0]["event"] == "moderation"  # a safety decision of ada's, with her words in its excerpt
        assert a.post("/v1/me/memories", json={"content": f"My codename is {mark}."}).status_code == 201
        assert a.put("/v1/me/instructions", json={"content": f"Call me {mark}."}).status_code == 200
        key = a.post("/v1/api-keys", json={"name": f"laptop {mark}"}).json()
        kept_chat = b.post("/v1/chats", json={"title": f"bo {mark}"}).json()["id"]
        assert chat_turn(b, kept_chat, f"I am {mark}bo. Say OK.", max_tokens=4)[-1]["event"] == "run.completed"
        for client, chat_id, n in ((a, chat, 4), (b, kept_chat, 2)):
            assert wait_for(lambda c=client, i=chat_id, k=n: len(c.get(f"/v1/chats/{i}/messages").json()["data"]) == k)

        session = connect_session(live.stack.settings.cassandra)
        ks = live.stack.settings.keyspace_name

        def decisions_of(user: str) -> list:
            return [r for r in session.execute(f"SELECT user_id, day FROM {ks}.safety_decisions") if r.user_id == user]

        try:
            assert wait_for(lambda: decisions_of(ada), 30), "the refusal's decision was not stored"
            erased = a.delete("/v1/me")
            assert erased.status_code == 200, erased.text
            assert erased.json() | {"sessions": 0} == {
                "object": "person.erased",
                "user_id": ada,
                "chats": 1,
                "memories": 1,
                "api_keys": 1,
                "sessions": 0,
            }
            assert a.get("/v1/me", headers={"Authorization": f"Bearer {key['key']}"}).status_code == 401
            assert a.get("/v1/chats").json()["data"] == [] and a.get("/v1/me/memories").json()["data"] == []
            assert a.get("/v1/me/instructions").json()["content"] == ""
            # read directly: the stages delete the messages and the decisions once told
            chat_uuid = uuid.UUID(chat)
            assert wait_for(
                lambda: (
                    not list(session.execute(f"SELECT content FROM {ks}.messages WHERE chat_id = %s", (chat_uuid,)))
                    and not decisions_of(ada)
                ),
                30,
            ), "the stages did not erase the messages or the decisions"
            for table, column in (
                ("chats", "chat_id"),
                ("memories", "user_id"),
                ("person_settings", "user_id"),
                ("api_keys_by_user", "user_id"),
                ("people", "user_id"),
            ):
                value = chat_uuid if column == "chat_id" else ada
                assert not list(session.execute(f"SELECT * FROM {ks}.{table} WHERE {column} = %s", (value,))), table
            # everyone else's is as it was
            assert [m["content"] for m in b.get(f"/v1/chats/{kept_chat}/messages").json()["data"]][0].startswith(
                f"I am {mark}bo"
            )
        finally:
            session.cluster.shutdown()
    with live.client(live.token("root", "pro", admin=True)) as admin:
        assert admin.delete(f"/v1/admin/people/{bo}").json()["chats"] == 1  # an admin erases someone else
    with live.client(credential(f"auditor-{mark}", "pro", 600, role="auditor")) as auditor:
        audit = wait_for(
            lambda: [
                r
                for r in auditor.get("/v1/admin/audit", params={"action": "person.erase"}).json()["data"]
                if r["target_user"] in (ada, bo)
            ],
            30,
        )
        assert {(r["actor"], r["target_user"]) for r in audit} == {(ada, ada), ("root", bo)}
