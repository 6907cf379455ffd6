"""The edge's routes on in-memory stores: each route takes its stores through its own dependency (api/deps.py),
so a test gives it fakes (tests/unit/edge_fakes.py) and checks what it answers, what it stores and what it
tells the stages, with no Kafka or Cassandra. The same routes run on the real services in tests/stack/."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from datetime import timedelta
from urllib.parse import unquote

from admission.limits import DEFAULT_TIERS
from api.auth import credential
from api.settings import ApiSettings
from safety.policy import Policy
from storage.ids import new_id
from storage.rows import Message
from topics.pipeline import AUDIT, FEEDBACK, MEMORY_CHANGED

from .edge_fakes import FakeProducer, now


def told(producer: FakeProducer) -> list[tuple[str, str | None]]:
    """What the memory and persistence stages were told: (action, message id)."""
    return [(s.record["action"], s.record["message_id"]) for s in producer.log.on(MEMORY_CHANGED)]


def test_a_retried_chat_creation_with_the_same_idempotency_key_gets_the_same_chat(edge):
    ada, bob = edge.signed("ada"), edge.signed("bob")
    keyed = {**ada, "Idempotency-Key": "create-1"}
    first = edge.http.post("/v1/chats", json={"title": "Plans"}, headers=keyed)
    again = edge.http.post("/v1/chats", json={"title": "Plans"}, headers=keyed)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and len(edge.chats.chats) == 1
    other = edge.http.post("/v1/chats", json={"title": "Other"}, headers=keyed)
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"
    # a key is the caller's own: another person's same key makes their own chat
    bobs = edge.http.post("/v1/chats", json={"title": "Plans"}, headers={**bob, "Idempotency-Key": "create-1"})
    assert bobs.status_code == 201 and bobs.json()["id"] != first.json()["id"] and len(edge.chats.chats) == 2
    bad = edge.http.post("/v1/chats", headers={**ada, "Idempotency-Key": "x" * 256})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_idempotency_key"
    assert len(edge.chats.chats) == 2


def test_a_chat_is_created_listed_renamed_reset_and_deleted(edge):
    ada = edge.signed("ada")
    created = edge.http.post("/v1/chats", json={"title": "Plans"}, headers=ada)
    assert created.status_code == 201, created.text
    chat = created.json()
    assert chat["object"] == "chat" and chat["title"] == "Plans"
    assert chat["created_at"] == chat["last_active_at"]
    chat_id = chat["id"]

    listed = edge.http.get("/v1/chats", headers=ada).json()
    assert [c["id"] for c in listed["data"]] == [chat_id] and listed["next_cursor"] is None
    assert edge.http.get(f"/v1/chats/{chat_id}", headers=ada).json()["active_run_id"] is None

    renamed = edge.http.patch(f"/v1/chats/{chat_id}", json={"title": "Trip"}, headers=ada)
    assert renamed.json()["title"] == "Trip"
    assert edge.http.get("/v1/chats", headers=ada).json()["data"][0]["title"] == "Trip"

    reset = edge.http.post(f"/v1/chats/{chat_id}/context/reset", headers=ada).json()
    assert reset["context_from"] == str(edge.chats.resets[uuid.UUID(chat_id)])

    assert edge.http.delete(f"/v1/chats/{chat_id}", headers=ada).status_code == 204
    assert told(edge.producer) == [("reset", None), ("chat_deleted", None)]  # the stages told before the row goes
    assert edge.http.get(f"/v1/chats/{chat_id}", headers=ada).status_code == 404
    assert edge.http.get("/v1/chats", headers=ada).json()["data"] == []


def test_another_persons_chat_is_not_found_and_nothing_is_told(edge):
    chat_id = edge.http.post("/v1/chats", json={}, headers=edge.signed("ada")).json()["id"]
    bob = edge.signed("bob")
    attempts = [
        edge.http.get(f"/v1/chats/{chat_id}", headers=bob),
        edge.http.patch(f"/v1/chats/{chat_id}", json={"title": "mine"}, headers=bob),
        edge.http.get(f"/v1/chats/{chat_id}/messages", headers=bob),
        edge.http.post(f"/v1/chats/{chat_id}/context/reset", headers=bob),
        edge.http.delete(f"/v1/chats/{chat_id}", headers=bob),
    ]
    for response in attempts:
        assert response.status_code == 404, response.text
        assert response.json() == {
            "error": {
                "message": f"No chat found with id '{chat_id}'.",
                "type": "not_found_error",
                "param": None,
                "code": "chat_not_found",
            }
        }
    assert edge.http.get("/v1/chats", headers=bob).json()["data"] == []
    assert edge.producer.log.sent == [] and uuid.UUID(chat_id) in edge.chats.chats


def test_an_edit_is_kept_and_told_as_the_tiers_policy_redacts_it(edge):
    """What a policy redacts never reaches the store or the log, an edit included (sending: the stack test)."""
    ada = edge.signed("ada")
    chat_id = edge.http.post("/v1/chats", json={}, headers=ada).json()["id"]
    question = str(new_id())
    edge.chats.messages.setdefault(uuid.UUID(chat_id), {})[question] = Message(question, "user", "Hi", now())
    edge.policies.policy = Policy(version="r1", rules=(), redact=("email", "secret"))
    sent = "Mail ada@example.org the token=abcdef123456 and 4111 1111 1111 1111"
    edited = edge.http.patch(f"/v1/chats/{chat_id}/messages/{question}", json={"content": sent}, headers=ada).json()
    kept = "Mail [redacted email] the token=[redacted secret] and 4111 1111 1111 1111"  # cards: not in this policy
    assert edited["content"] == kept
    assert edge.producer.log.on(MEMORY_CHANGED)[-1].record["content"] == kept
    assert edge.chats.edits[uuid.UUID(chat_id)][question].content == kept


def test_an_edit_and_a_delete_reach_memory_and_only_an_answer_is_rated(edge):
    ada = edge.signed("ada")
    chat_id = edge.http.post("/v1/chats", json={}, headers=ada).json()["id"]
    question, run = str(new_id()), str(new_id())
    stored = edge.chats.messages.setdefault(uuid.UUID(chat_id), {})
    stored[question] = Message(question, "user", "What is Kafka?", now(), run_id=run)
    stored[run] = Message(run, "assistant", "A log.", now(), run_id=run, model="m", finish_reason="stop")

    for blank in (" ", "\f", "\n\t"):  # what the schema's pattern refuses, the route refuses, nothing told
        empty = edge.http.patch(f"/v1/chats/{chat_id}/messages/{question}", json={"content": blank}, headers=ada)
        assert (empty.status_code, empty.json()["error"]["code"]) == (400, "empty_content")
    assert not edge.producer.log.on(MEMORY_CHANGED)
    edited = edge.http.patch(f"/v1/chats/{chat_id}/messages/{question}", json={"content": "What is Avro?"}, headers=ada)
    assert edited.status_code == 200, edited.text
    assert edited.json()["content"] == "What is Avro?" and edited.json()["role"] == "user"
    change = edge.producer.log.on(MEMORY_CHANGED)[-1].record
    assert (change["action"], change["message_id"], change["content"]) == ("edited", question, "What is Avro?")
    listed = edge.http.get(f"/v1/chats/{chat_id}/messages", headers=ada).json()["data"]
    assert [m["content"] for m in listed] == ["What is Avro?", "A log."]

    refused = edge.http.post(f"/v1/chats/{chat_id}/messages/{question}/feedback", json={"rating": "up"}, headers=ada)
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, "message_id")
    rated = edge.http.post(f"/v1/chats/{chat_id}/messages/{run}/feedback", json={"rating": "up"}, headers=ada)
    assert rated.status_code == 202 and rated.json() == {"id": run, "object": "feedback", "rating": "up"}
    [feedback] = edge.producer.log.on(FEEDBACK)
    assert (feedback.record["message_id"], feedback.record["rating"], feedback.key) == (run, "up", chat_id)

    assert edge.http.delete(f"/v1/chats/{chat_id}/messages/{run}", headers=ada).status_code == 204
    assert told(edge.producer)[-1] == ("deleted", run)
    assert [m["id"] for m in edge.http.get(f"/v1/chats/{chat_id}/messages", headers=ada).json()["data"]] == [question]
    gone = edge.http.delete(f"/v1/chats/{chat_id}/messages/{run}", headers=ada)
    assert (gone.status_code, gone.json()["error"]["code"]) == (404, "message_not_found")


def test_an_api_key_speaks_for_its_owner_cannot_manage_keys_and_ends_when_revoked(edge):
    ada = edge.signed("ada")
    minted = edge.http.post("/v1/api-keys", json={"name": "ci"}, headers=ada)
    assert minted.status_code == 201, minted.text
    key = minted.json()
    assert key["key"].startswith("pk-") and key["prefix"] == key["key"][:7] and key["revoked_at"] is None
    by_key = {"Authorization": f"Bearer {key['key']}"}

    me = edge.http.get("/v1/me", headers=by_key).json()
    assert (me["user_id"], me["via_key"], me["admin"]) == ("ada", True, False)
    assert edge.http.get("/v1/api-keys", headers=by_key).json()["error"]["code"] == "key_not_allowed"
    listed = edge.http.get("/v1/api-keys", headers=ada).json()["data"]
    assert [k["id"] for k in listed] == [key["id"]] and "key" not in listed[0]  # shown once, at minting

    assert edge.http.delete(f"/v1/api-keys/{key['id']}", headers=edge.signed("bob")).status_code == 404
    assert edge.http.delete(f"/v1/api-keys/{key['id']}", headers=ada).status_code == 204
    refused = edge.http.get("/v1/me", headers=by_key)
    assert (refused.status_code, refused.json()["error"]["code"]) == (401, "invalid_api_key")


def test_a_key_is_held_to_its_scopes_and_refused_once_expired(edge):
    ada = edge.signed("ada")
    key = edge.http.post("/v1/api-keys", json={"scopes": ["usage"], "expires_in_days": 1}, headers=ada).json()
    assert key["scopes"] == ["usage"] and key["expires_at"] > key["created_at"]
    by_key = {"Authorization": f"Bearer {key['key']}"}
    for outside in (edge.http.post("/v1/chats", headers=by_key), edge.http.get("/v1/chats", headers=by_key)):
        assert (outside.status_code, outside.json()["error"]["code"]) == (403, "insufficient_scope")
    assert edge.chats.chats == {}, "nothing made"
    assert edge.http.get("/v1/me", headers=by_key).status_code == 200, "who it speaks for: any key"

    [(digest, (owner, tier, stored))] = edge.keys.keys.items()
    edge.keys.keys[digest] = (owner, tier, replace(stored, expires_at=now() - timedelta(seconds=1)))
    expired = edge.http.get("/v1/me", headers=by_key)
    assert (expired.status_code, expired.json()["error"]["code"]) == (401, "expired_api_key")
    never = edge.http.post("/v1/api-keys", json={"expires_in_days": None}, headers=ada).json()
    assert never["expires_at"] is None and never["scopes"] == ["chat", "openai", "usage"]
    too_long = edge.http.post("/v1/api-keys", json={"expires_in_days": 4000}, headers=ada)
    assert too_long.status_code == 400
    for not_a_number in (True, "7"):  # the schema says integer: no coercion
        coerced = edge.http.post("/v1/api-keys", json={"expires_in_days": not_a_number}, headers=ada)
        assert coerced.status_code == 400, not_a_number
    admin_key = edge.http.post("/v1/api-keys", json={"scopes": ["admin"]}, headers=ada)
    assert (admin_key.status_code, admin_key.json()["error"]["code"]) == (403, "admin_required")


def test_an_admin_ends_every_key_of_a_person_at_once(edge):
    ada, root = edge.signed("ada"), {"Authorization": f"Bearer {credential('root', admin=True)}"}
    keys = [edge.http.post("/v1/api-keys", json={"name": n}, headers=ada).json()["key"] for n in ("a", "b")]
    bobs = edge.http.post("/v1/api-keys", headers=edge.signed("bob")).json()["key"]
    edge.people.sessions["ada"] = 2
    assert edge.http.post("/v1/admin/users/ada/revoke", headers=ada).status_code == 403, "an admin's alone"
    assert not edge.producer.log.on(AUDIT), "a refused request leaves no trace"
    ended = edge.http.post("/v1/admin/users/ada/revoke", headers=root)
    assert ended.status_code == 200
    assert ended.json() == {"user_id": "ada", "revoked_keys": 2, "ended_sessions": 2}
    [trace] = [s.record for s in edge.producer.log.on(AUDIT)]
    assert (trace["actor"], trace["action"], trace["target_user"]) == ("root", "access.revoke", "ada")
    for key in keys:
        refused = edge.http.get("/v1/me", headers={"Authorization": f"Bearer {key}"})
        assert (refused.status_code, refused.json()["error"]["code"]) == (401, "invalid_api_key")
    assert edge.http.get("/v1/me", headers={"Authorization": f"Bearer {bobs}"}).status_code == 200
    again = edge.http.post("/v1/admin/users/ada/revoke", headers=root).json()
    assert again["revoked_keys"] == 0


def test_bad_input_is_an_openai_shaped_400_and_nothing_is_written(edge):
    ada = edge.signed("ada")
    long_title = edge.http.post("/v1/chats", json={"title": "x" * 201}, headers=ada)
    assert long_title.status_code == 400
    assert long_title.json()["error"]["type"] == "invalid_request_error"
    assert long_title.json()["error"]["param"] == "title"
    broken = edge.http.post("/v1/chats", content=b"{", headers={**ada, "Content-Type": "application/json"})
    assert broken.json()["error"]["code"] == "invalid_json"
    assert edge.chats.chats == {}


def operations(doc: dict) -> list[tuple[str, str, dict]]:
    return [(path, method, op) for path, item in doc["paths"].items() for method, op in item.items()]


def test_the_openapi_document_comes_from_the_routes_models(edge):
    doc = edge.app.openapi()
    schemas = doc["components"]["schemas"]
    assert "422" not in json.dumps(doc["paths"]) and "HTTPValidationError" not in schemas
    untyped = {("/v1/usage/report", "get"), ("/v1/admin/runs/{run_id}", "get"), ("/v1/admin/evals", "get")}
    for path, method, op in operations(doc):
        if path.startswith("/v1/"):  # every error in OpenAI's shape
            for status in ("400", "401", "404", "429", "4XX", "503"):
                error = op["responses"][status]["content"]["application/json"]["schema"]
                assert error == {"$ref": "#/components/schemas/ErrorBody"}, (path, method, status)
        ok = next((r for s, r in op["responses"].items() if s.startswith("2")), None)
        if ok is None or "content" not in ok or (path, method) in untyped:
            continue
        for media, content in ok["content"].items():
            if media == "application/json":  # a model of the code's, not a free-form object
                assert "$ref" in content["schema"], (path, method)
            elif path != "/metrics":  # Prometheus's text format
                assert media == "text/event-stream" and content["schema"]["required"], (path, method)

    linked = [
        link for _, _, op in operations(doc) for r in op["responses"].values() for link in r.get("links", {}).values()
    ]
    assert len(linked) >= 10
    for link in linked:  # each link names an operation the document has
        pointer, _, method = unquote(link["operationRef"]).removeprefix("#/paths/").rpartition("/")
        path = pointer.replace("~1", "/").replace("~0", "~")
        assert method in doc["paths"][path], link

    settings = ApiSettings()  # the limits settings decide, written where the bodies are described
    assert schemas["NewMessage"]["properties"]["content"]["maxLength"] == settings.max_content_chars
    models = [o for o in schemas["Completion"]["properties"]["model"]["anyOf"] if o.get("type") == "string"]
    assert models[0]["enum"] == list(settings.models)


def test_instructions_and_a_chats_model_are_checked_before_anything_is_written(edge):
    ada, bob = edge.signed("ada"), edge.signed("bob")
    put = edge.http.put("/v1/me/instructions", json={"content": " Use metric units. "}, headers=ada)
    assert put.status_code == 200 and put.json()["content"] == "Use metric units."
    too_long = edge.http.put("/v1/me/instructions", json={"content": "metric " * 1000}, headers=ada)
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "instructions_too_long"
    assert edge.http.get("/v1/me/instructions", headers=ada).json()["content"] == "Use metric units."
    assert edge.http.get("/v1/me/instructions", headers=bob).json()["content"] == ""

    chat = edge.http.post("/v1/chats", json={"title": "Trips"}, headers=ada).json()["id"]
    large = "smollm2-135m-instruct-8k"
    changed = edge.http.patch(f"/v1/chats/{chat}", json={"model": large, "instructions": "Be brief."}, headers=ada)
    assert changed.status_code == 200 and changed.json()["title"] == "Trips"
    unknown = edge.http.patch(f"/v1/chats/{chat}", json={"model": "gpt-9", "title": "X"}, headers=ada)
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "model_not_found"
    edge.limits.tiers["pro"] = DEFAULT_TIERS["pro"].model_copy(update={"models": ("smollm2-135m-instruct",)})
    refused = edge.http.patch(f"/v1/chats/{chat}", json={"model": large, "title": "Y"}, headers=ada)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "model_not_allowed"
    assert "may use: smollm2-135m-instruct" in refused.json()["error"]["message"]
    assert edge.http.patch(f"/v1/chats/{chat}", json={"model": large}, headers=bob).status_code == 404
    shown = edge.http.get(f"/v1/chats/{chat}", headers=ada).json()
    assert (shown["title"], shown["model"], shown["instructions"]) == ("Trips", large, "Be brief.")
    cleared = edge.http.patch(f"/v1/chats/{chat}", json={"model": None}, headers=ada).json()
    assert cleared["model"] is None and cleared["instructions"] == "Be brief."


def test_a_listing_is_the_current_branch_with_siblings_and_another_branch_can_be_made_current(edge):
    ada, bob = edge.signed("ada"), edge.signed("bob")
    chat_id = edge.http.post("/v1/chats", json={}, headers=ada).json()["id"]
    q1, a1, q2, a2, q2b, a2b = (str(new_id()) for _ in range(6))
    stored = edge.chats.messages.setdefault(uuid.UUID(chat_id), {})
    for mid, role, text, parent in [
        (q1, "user", "Plan a trip.", "00000000-0000-1000-8000-000000000000"),
        (a1, "assistant", "Where to?", q1),
        (q2, "user", "Paris.", a1),
        (a2, "assistant", "Paris it is.", q2),
        (q2b, "user", "Rome.", a1),  # the question edited and sent again
        (a2b, "assistant", "Rome it is.", q2b),
    ]:
        stored[mid] = Message(mid, role, text, now(), run_id=mid, parent_id=parent)
    url = f"/v1/chats/{chat_id}/messages"

    current = edge.http.get(url, headers=ada).json()["data"]
    assert [m["id"] for m in current] == [q1, a1, q2b, a2b]
    assert current[0]["parent_id"] is None and current[2]["parent_id"] == a1
    assert current[2]["sibling_ids"] == [q2, q2b] and current[1]["sibling_ids"] == [a1]
    old = edge.http.get(url, params={"branch": q2}, headers=ada).json()["data"]
    assert [m["content"] for m in old] == ["Plan a trip.", "Where to?", "Paris.", "Paris it is."]

    chosen = edge.http.put(f"/v1/chats/{chat_id}/branch", json={"message_id": q2}, headers=ada)
    assert chosen.status_code == 200 and chosen.json() == {"message_id": q2, "leaf_id": a2}
    assert [m["id"] for m in edge.http.get(url, headers=ada).json()["data"]] == [q1, a1, q2, a2]
    paged = edge.http.get(url, params={"limit": 2}, headers=ada).json()
    rest = edge.http.get(url, params={"cursor": paged["next_cursor"]}, headers=ada).json()["data"]
    assert [m["id"] for m in paged["data"] + rest] == [q1, a1, q2, a2]

    unknown = str(new_id())
    for bad in (unknown, "not-an-id"):
        missing = edge.http.put(f"/v1/chats/{chat_id}/branch", json={"message_id": bad}, headers=ada)
        assert (missing.status_code, missing.json()["error"]["code"]) == (400, "message_not_found")
        assert edge.http.get(url, params={"branch": bad}, headers=ada).status_code == 400
    assert edge.http.put(f"/v1/chats/{chat_id}/branch", json={"message_id": q2b}, headers=bob).status_code == 404
    assert edge.http.get(url, params={"branch": q2b}, headers=bob).status_code == 404
    assert [m["id"] for m in edge.http.get(url, headers=ada).json()["data"]] == [q1, a1, q2, a2]  # unchanged


def test_a_share_is_a_snapshot_for_signed_in_people_that_its_owner_lists_and_revokes(edge):
    ada, bob = edge.signed("ada"), edge.signed("bob")
    chat_id = edge.http.post("/v1/chats", json={"title": "Trip"}, headers=ada).json()["id"]
    empty = edge.http.post(f"/v1/chats/{chat_id}/share", headers=ada)
    assert (empty.status_code, empty.json()["error"]["code"]) == (400, "empty_chat")
    q, a = str(new_id()), str(new_id())
    stored = edge.chats.messages.setdefault(uuid.UUID(chat_id), {})
    stored[q] = Message(q, "user", "Plan a trip.", now(), run_id=a)
    stored[a] = Message(a, "assistant", "Where to?", now(), run_id=a, model="m")

    assert edge.http.post(f"/v1/chats/{chat_id}/share", headers=bob).status_code == 404  # not bob's chat
    public = edge.http.post(f"/v1/chats/{chat_id}/share", json={"public": True}, headers=ada)
    assert (public.status_code, public.json()["error"]["code"]) == (403, "public_shares_disabled")
    yes = edge.http.post(f"/v1/chats/{chat_id}/share", json={"public": "yes"}, headers=ada)
    assert yes.status_code == 400, "the schema says boolean: no coercion"
    made = edge.http.post(f"/v1/chats/{chat_id}/share", headers=ada)
    assert made.status_code == 201, made.text
    share = made.json()
    assert len(share["id"]) >= 22 and share["url"].endswith(f"/s/{share['id']}") and not share["public"]
    stored[q] = Message(q, "user", "Plan a trip to Rome.", now(), run_id=a)  # later changes do not reach it

    read = edge.http.get(f"/v1/shared/{share['id']}", headers=bob)  # another signed-in person
    assert read.status_code == 200
    assert [(m["role"], m["content"]) for m in read.json()["messages"]] == [
        ("user", "Plan a trip."),
        ("assistant", "Where to?"),
    ]
    anonymous = edge.http.get(f"/v1/shared/{share['id']}")
    assert (anonymous.status_code, anonymous.json()["error"]["code"]) == (401, "missing_token")
    assert [s["id"] for s in edge.http.get("/v1/me/shares", headers=ada).json()["data"]] == [share["id"]]
    assert edge.http.get("/v1/me/shares", headers=bob).json()["data"] == []

    assert edge.http.delete(f"/v1/chats/{chat_id}/share/{share['id']}", headers=bob).status_code == 404
    assert edge.http.delete(f"/v1/chats/{chat_id}/share/{share['id']}", headers=ada).status_code == 204
    gone = edge.http.get(f"/v1/shared/{share['id']}", headers=bob)
    assert (gone.status_code, gone.json()["error"]["code"]) == (404, "share_not_found")
    assert edge.http.get("/v1/me/shares", headers=ada).json()["data"] == []

    again = edge.http.post(f"/v1/chats/{chat_id}/share", headers=ada).json()
    assert edge.http.delete(f"/v1/chats/{chat_id}", headers=ada).status_code == 204  # the chat goes, its shares too
    assert edge.http.get(f"/v1/shared/{again['id']}", headers=ada).status_code == 404


def test_pinned_chats_come_first_and_archived_ones_are_listed_apart(edge):
    ada, bob = edge.signed("ada"), edge.signed("bob")
    c1, c2, c3, c4, c5 = [
        edge.http.post("/v1/chats", json={"title": f"c{i}"}, headers=ada).json()["id"] for i in range(1, 6)
    ]
    pinned = edge.http.patch(f"/v1/chats/{c1}", json={"pinned": True}, headers=ada).json()
    assert pinned["pinned"] is True and pinned["archived"] is False and pinned["title"] == "c1"
    assert edge.http.patch(f"/v1/chats/{c4}", json={"archived": True}, headers=ada).json()["archived"] is True
    assert edge.http.patch(f"/v1/chats/{c2}", json={"pinned": True}, headers=bob).status_code == 404
    assert edge.http.patch(f"/v1/chats/{c2}", json={"pinned": "yes"}, headers=ada).status_code == 400

    first = edge.http.get("/v1/chats", params={"limit": 2}, headers=ada).json()
    assert [c["id"] for c in first["data"]] == [c1, c5, c3] and first["data"][0]["pinned"]
    rest = edge.http.get("/v1/chats", params={"limit": 2, "cursor": first["next_cursor"]}, headers=ada).json()
    assert [c["id"] for c in rest["data"]] == [c2] and rest["next_cursor"] is None
    shelved = edge.http.get("/v1/chats", params={"archived": "true"}, headers=ada).json()["data"]
    assert [(c["id"], c["archived"]) for c in shelved] == [(c4, True)]
    assert edge.http.get(f"/v1/chats/{c4}", headers=ada).json()["archived"] is True
    assert edge.http.get("/v1/chats", params={"archived": "true"}, headers=bob).json()["data"] == []

    edge.http.patch(f"/v1/chats/{c4}", json={"archived": False}, headers=ada)
    assert c4 in [c["id"] for c in edge.http.get("/v1/chats", headers=ada).json()["data"]]
    assert edge.http.delete(f"/v1/chats/{c1}", headers=ada).status_code == 204
    assert edge.preferences.marked["ada"] == {}  # its mark went with it
