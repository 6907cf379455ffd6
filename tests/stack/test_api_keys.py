"""API keys: minted once, hashed at rest, usable as a Bearer credential, revocable, owned."""

from cassandra.cluster import Cluster

from api.auth import key_hash
from api.settings import ApiSettings


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
