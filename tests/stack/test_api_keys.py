"""API keys: minted once, hashed at rest, usable as a Bearer credential, revocable, owned."""

from datetime import UTC, datetime, timedelta

from cassandra.cluster import Cluster

from api.auth import key_hash
from api.settings import ApiSettings

from .conftest import wait_for


def test_a_key_works_until_revoked_and_is_stored_only_as_a_hash(live):
    user = f"key-user-{live.namespace}"
    client = live.client(live.token(user, tier="enterprise"))
    created = client.post("/v1/api-keys", json={"name": "laptop"})
    assert created.status_code == 201
    key = created.json()["key"]
    assert key.startswith("pk-") and len(key) > 40 and created.json()["tier"] == "enterprise"

    with live.client(key) as by_key:
        chat = by_key.post("/v1/chats").json()
        assert client.get(f"/v1/chats/{chat['id']}").status_code == 200, "the key acts as its owner"
        assert by_key.get("/v1/models").status_code == 200
        assert by_key.post("/v1/api-keys").status_code == 403, "a key cannot mint keys"

        listed = client.get("/v1/api-keys").json()["data"]
        assert [k["name"] for k in listed] == ["laptop"] and "key" not in listed[0]

        session = Cluster(["127.0.0.1"], port=9042).connect()
        try:
            ks = ApiSettings(namespace=live.namespace).keyspace_name
            rows = list(session.execute(f"SELECT key_hash FROM {ks}.api_keys"))
            assert key_hash(key) in {r.key_hash for r in rows}
            dump = " ".join(str(r) for r in session.execute(f"SELECT * FROM {ks}.api_keys_by_user"))
            assert key not in dump and key[7:] not in dump, "the key itself is never stored"
        finally:
            session.cluster.shutdown()

        assert client.delete(f"/v1/api-keys/{listed[0]['id']}").status_code == 204
        refused = by_key.get("/v1/chats")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert client.get("/v1/api-keys").json()["data"][0]["revoked_at"]


def test_unknown_keys_and_other_users_keys(live):
    alice, bob = live.client(live.token()), live.client(live.token())
    key_id = alice.post("/v1/api-keys").json()["id"]
    assert bob.delete(f"/v1/api-keys/{key_id}").status_code == 404
    assert bob.delete("/v1/api-keys/not-an-id").status_code == 404
    with live.client("pk-" + "A" * 43) as forged:
        assert forged.get("/v1/chats").status_code == 401


def test_a_key_is_held_to_its_scopes_records_its_use_and_ends_when_it_expires(live):
    client = live.client(live.token())
    made = client.post("/v1/api-keys", json={"name": "reports", "scopes": ["usage"], "expires_in_days": 1}).json()
    assert made["scopes"] == ["usage"] and made["expires_at"] and made["last_used_at"] is None
    completion = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    with live.client(made["key"]) as by_key:
        assert by_key.get("/v1/usage").status_code == 200
        for refused in (by_key.post("/v1/chats"), by_key.post("/v1/chat/completions", json=completion)):
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "insufficient_scope"
        assert by_key.get("/v1/admin/limits").status_code == 403

        def used():
            [key] = client.get("/v1/api-keys").json()["data"]
            return key["last_used_at"]

        assert wait_for(used), "its last use is recorded"

        # time passes: the stored expiry is a moment ago, and the next request on any replica is refused
        session = Cluster(["127.0.0.1"], port=9042).connect()
        try:
            ks = ApiSettings(namespace=live.namespace).keyspace_name
            past = datetime.now(UTC) - timedelta(seconds=1)
            session.execute(
                f"UPDATE {ks}.api_keys SET expires_at = %s WHERE key_hash = %s", (past, key_hash(made["key"]))
            )
        finally:
            session.cluster.shutdown()
        for replica in (0, 1):
            with live.client(made["key"], replica=replica) as on_replica:
                expired = on_replica.get("/v1/usage")
                assert expired.status_code == 401 and expired.json()["error"]["code"] == "expired_api_key"


def test_only_an_admin_mints_an_admin_key_and_it_is_for_the_admin_routes(live):
    member = live.client(live.token())
    refused = member.post("/v1/api-keys", json={"scopes": ["admin"]})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_required"
    admin = live.client(live.token(admin=True))
    key = admin.post("/v1/api-keys", json={"scopes": ["admin"], "expires_in_days": None}).json()
    assert key["expires_at"] is None
    with live.client(key["key"]) as by_key:
        assert by_key.get("/v1/admin/limits").status_code == 200
        assert by_key.get("/v1/chats").status_code == 403


def test_an_admin_ends_all_of_a_persons_keys_at_once_on_every_replica(live):
    user = f"leaver-{live.namespace}"
    person = live.client(live.token(user))
    keys = [person.post("/v1/api-keys", json={"name": name}).json()["key"] for name in ("laptop", "ci")]
    admin = live.client(live.token(admin=True))
    ended = admin.post(f"/v1/admin/users/{user}/revoke")
    assert ended.status_code == 200 and ended.json()["revoked_keys"] == 2
    for key, replica in zip(keys, (0, 1), strict=True):
        with live.client(key, replica=replica) as by_key:
            refused = by_key.get("/v1/chats")
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert all(k["revoked_at"] for k in person.get("/v1/api-keys").json()["data"])
