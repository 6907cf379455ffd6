"""The provider's ID tokens as api/oidc.py checks them, with keys made here (the real provider's own tokens:
tests/stack/test_signin.py): forged, expired, wrong-issuer, wrong-audience, `alg: none` and symmetric tokens
are each refused, and a key the provider rotated in is found without a restart."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from api.errors import ApiError
from api.oidc import Provider, RoleMap, pkce
from api.routes.signin import local_path
from api.sessions import cookie_value, parse_cookie

ISSUER = "https://id.example.test/realms/acme"


class Keys:
    """The provider's JWKS, served from memory; `fetched` counts its fetches."""

    def __init__(self) -> None:
        self.keys: dict[str, object] = {}
        self.fetched = 0

    def add(self, kid: str, key: object) -> None:
        self.keys[kid] = key

    def jwks(self) -> dict:
        out = []
        for kid, key in self.keys.items():
            algorithm = (
                jwt.algorithms.RSAAlgorithm if isinstance(key, rsa.RSAPrivateKey) else jwt.algorithms.ECAlgorithm
            )
            jwk = algorithm.to_jwk(key.public_key(), as_dict=True)
            out.append({**jwk, "kid": kid, "use": "sig"})
        return {"keys": out}


@pytest.fixture
def provider(monkeypatch):
    keys = Keys()
    keys.add("k1", rsa.generate_private_key(public_exponent=65537, key_size=2048))

    def fetch_data(self):  # PyJWKClient's one fetch of the JWKS, from memory
        keys.fetched += 1
        return keys.jwks()

    monkeypatch.setattr(jwt.PyJWKClient, "fetch_data", fetch_data)
    meta = {
        "issuer": ISSUER,
        "jwks_uri": f"{ISSUER}/certs",
        "token_endpoint": f"{ISSUER}/token",
        "authorization_endpoint": f"{ISSUER}/auth",
    }
    http = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: httpx.Response(200, json=meta)))
    made = Provider(ISSUER, "parley", "secret", "openid", http)
    made.keys = keys
    return made


def signed(provider, kid="k1", alg="RS256", **changes) -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": "parley", "sub": "u-1", "iat": now, "exp": now + 300, "nonce": "n1", **changes}
    return jwt.encode(claims, provider.keys.keys[kid], algorithm=alg, headers={"kid": kid})


def verify(provider, token: str) -> dict:
    return asyncio.run(provider.verify(token))


def refused(provider, token: str) -> str:
    with pytest.raises(ApiError) as caught:
        verify(provider, token)
    assert caught.value.status == 401
    return str(caught.value.code)


def test_a_token_the_provider_signed_for_this_client_passes(provider):
    claims = verify(provider, signed(provider))
    assert claims["sub"] == "u-1" and claims["nonce"] == "n1"


def test_forged_expired_wrong_issuer_and_wrong_audience_tokens_are_refused(provider):
    good = signed(provider)
    head, body, sig = good.split(".")
    other = jwt.encode({"sub": "admin"}, "x" * 32, algorithm="HS256").split(".")[1]
    assert refused(provider, f"{head}.{other}.{sig}") == "invalid_token", "a body the signature is not for"
    assert refused(provider, signed(provider, exp=int(time.time()) - 120)) == "expired_token"
    assert refused(provider, signed(provider, iss="https://evil.example.test")) == "invalid_token"
    assert refused(provider, signed(provider, aud="another-client")) == "invalid_token"
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    forged = jwt.encode(
        {"iss": ISSUER, "aud": "parley", "sub": "u-1", "iat": now, "exp": now + 60},
        stranger,
        algorithm="RS256",
        headers={"kid": "k1"},
    )
    assert refused(provider, forged) == "invalid_token", "signed by a key that is not the provider's"


def test_alg_none_and_symmetric_tokens_are_refused_whatever_they_claim(provider):
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": "parley", "sub": "u-1", "iat": now, "exp": now + 60}
    unsigned = jwt.encode(claims, None, algorithm="none", headers={"kid": "k1"})
    assert refused(provider, unsigned) == "invalid_token"
    # HS256 "signed" with the provider's public key (the classic key-confusion attack), made by hand: PyJWT
    # itself refuses to sign with an asymmetric key as an HMAC secret
    public = provider.keys.keys["k1"].public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)

    def part(value: dict) -> bytes:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=")

    signing = part({"alg": "HS256", "typ": "JWT", "kid": "k1"}) + b"." + part(claims)
    mac = base64.urlsafe_b64encode(hmac.new(public, signing, hashlib.sha256).digest()).rstrip(b"=")
    assert refused(provider, (signing + b"." + mac).decode()) == "invalid_token"


def test_a_key_rotated_in_at_the_provider_is_found_without_a_restart(provider):
    assert verify(provider, signed(provider))
    before = provider.keys.fetched
    provider.keys.add("k2", ec.generate_private_key(ec.SECP256R1()))
    claims = verify(provider, signed(provider, kid="k2", alg="ES256"))
    assert claims["sub"] == "u-1" and provider.keys.fetched == before + 1


def test_groups_map_to_the_highest_role_and_tier_and_a_bad_map_is_refused_at_start():
    roles = RoleMap()
    assert (roles.role({"groups": ["parley-pro", "parley-auditors"]}), roles.tier({"groups": ["parley-pro"]})) == (
        "auditor",
        "pro",
    )
    both = {"groups": ["/acme/parley-admins", "parley-owners", "parley-enterprise", "parley-pro"]}
    assert (roles.role(both), roles.tier(both)) == ("owner", "enterprise")
    assert (roles.role({}), roles.tier({"groups": "staff"})) == ("member", "free")
    custom = RoleMap.parse('{"claim": "roles", "roles": {"it-ops": "admin"}, "default_tier": "pro"}')
    assert (custom.role({"roles": ["it-ops"]}), custom.tier({})) == ("admin", "pro")
    with pytest.raises(ValueError, match="superuser"):
        RoleMap.parse('{"roles": {"x": "superuser"}}')


def test_the_session_cookie_names_its_person_and_a_mangled_one_names_no_one():
    value = cookie_value("5b7c-ü.id", "s" * 43)
    assert parse_cookie(value) == ("5b7c-ü.id", "s" * 43)
    for bad in ("", "abc", "!!!." + "s" * 43, cookie_value("u", "short")):
        assert parse_cookie(bad) is None


def test_after_sign_in_only_a_path_of_this_site_is_followed():
    assert local_path("/c/123?x=1") == "/c/123?x=1"
    for outside in (None, "", "https://evil.test/", "//evil.test/x", "/\\evil.test", "c/1"):
        assert local_path(outside) == "/"


def test_pkce_challenge_is_the_verifiers_s256():
    verifier, challenge = pkce()
    assert 43 <= len(verifier) <= 128
    assert challenge == base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


def test_local_passwords_are_kept_as_argon2id_hashes():
    from api.routes.local_accounts import HASHER

    hashed = HASHER.hash("a-local-password")
    assert hashed.startswith("$argon2id$") and "a-local-password" not in hashed
    assert HASHER.verify(hashed, "a-local-password")
