"""An OpenID Connect provider, as the edge uses it: discovery, the authorization-code request with PKCE (S256),
the code and refresh-token exchanges (the edge is a confidential client: the browser never holds a provider
token), and the ID token's verification against the provider's JWKS.

The ID token must be signed with an asymmetric algorithm (RS*, PS*, ES*, EdDSA; never HS* or `none`), by a key
of the provider's JWKS, for this client (`aud`), by this issuer (`iss`), unexpired, and carry the nonce this
sign-in sent. PyJWT's JWKS client fetches the keys and fetches them again when a token names a key it has not
seen, so a provider's key rotation needs no restart here.

Groups map to a role and a tier (`RoleMap`) at every sign-in and every renewal, so a change of group at the
provider follows within the session check interval.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import httpx
import jwt

from api.errors import ApiError

ASYMMETRIC = [
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
]
ROLES = ("member", "auditor", "admin", "owner")  # least to most
TIER_ORDER = ("free", "pro", "enterprise")


@dataclass(frozen=True)
class RoleMap:
    """Which groups (values of `claim` in the ID token) make which role and tier; the highest of each wins, and
    a person in none gets the defaults."""

    roles: dict[str, str] = field(
        default_factory=lambda: {
            "parley-owners": "owner",
            "parley-admins": "admin",
            "parley-auditors": "auditor",
        }
    )
    tiers: dict[str, str] = field(
        default_factory=lambda: {"parley-enterprise": "enterprise", "parley-pro": "pro"}
    )
    claim: str = "groups"
    default_role: str = "member"
    default_tier: str = "free"

    @classmethod
    def parse(cls, text: str) -> RoleMap:
        """From JSON: {"claim", "roles": {group: role}, "tiers": {group: tier}, "default_role", "default_tier"};
        keys left out keep the defaults above."""
        if not text.strip():
            return cls()
        raw = json.loads(text)
        made = cls(
            **{
                k: raw[k]
                for k in ("roles", "tiers", "claim", "default_role", "default_tier")
                if k in raw
            }
        )
        bad = [r for r in [*made.roles.values(), made.default_role] if r not in ROLES]
        bad += [t for t in [*made.tiers.values(), made.default_tier] if t not in TIER_ORDER]
        if bad:
            raise ValueError(f"unknown roles or tiers in the role map: {', '.join(bad)}")
        return made

    def groups(self, claims: dict[str, Any]) -> list[str]:
        value = claims.get(self.claim) or []
        names = [value] if isinstance(value, str) else [str(v) for v in value]
        return [
            n.rsplit("/", 1)[-1] for n in names
        ]  # a full path (/org/parley-admins) counts by its name

    def role(self, claims: dict[str, Any]) -> str:
        found = [self.roles[g] for g in self.groups(claims) if g in self.roles]
        return max(found, key=ROLES.index, default=self.default_role)

    def tier(self, claims: dict[str, Any]) -> str:
        found = [self.tiers[g] for g in self.groups(claims) if g in self.tiers]
        return max(found, key=TIER_ORDER.index, default=self.default_tier)


@dataclass(frozen=True)
class Tokens:
    claims: dict[str, Any]  # the verified ID token's
    refresh: str | None


class Refused(Exception):
    """The provider refused a refresh: the person was disabled or removed, or their session there ended."""


def pkce() -> tuple[str, str]:
    """(verifier, its S256 challenge)."""
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


class Provider:
    def __init__(
        self, issuer: str, client_id: str, client_secret: str, scopes: str, http: httpx.AsyncClient
    ) -> None:
        self.issuer = issuer.rstrip("/")
        self.client_id = client_id
        self._secret = client_secret
        self.scopes = scopes
        self._http = http
        self._meta: dict[str, Any] | None = None
        self._jwks: jwt.PyJWKClient | None = None
        self._lock = asyncio.Lock()

    async def meta(self) -> dict[str, Any]:
        async with self._lock:
            if self._meta is None:
                url = f"{self.issuer}/.well-known/openid-configuration"
                try:
                    response = await self._http.get(url)
                    response.raise_for_status()
                except httpx.HTTPError as exc:
                    raise unavailable() from exc
                meta = response.json()
                if meta.get("issuer", "").rstrip("/") != self.issuer:
                    raise ApiError(
                        502, "The identity provider names another issuer.", "provider_misconfigured"
                    )
                self._meta = meta
                self._jwks = jwt.PyJWKClient(meta["jwks_uri"], cache_keys=True, lifespan=3600)
            return self._meta

    async def authorize_url(self, redirect_uri: str, state: str, nonce: str, challenge: str) -> str:
        query = {
            "response_type": "code",
            "client_id": self.client_id,
            "redirect_uri": redirect_uri,
            "scope": self.scopes,
            "state": state,
            "nonce": nonce,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        }
        return f"{(await self.meta())['authorization_endpoint']}?{urlencode(query)}"

    async def logout_url(self, redirect_uri: str) -> str | None:
        end = (await self.meta()).get("end_session_endpoint")
        query = {"client_id": self.client_id, "post_logout_redirect_uri": redirect_uri}
        return f"{end}?{urlencode(query)}" if end else None

    async def exchange(self, code: str, verifier: str, redirect_uri: str, nonce: str) -> Tokens:
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "code_verifier": verifier,
            "redirect_uri": redirect_uri,
        }
        body = await self._token(form)
        if body is None:
            raise ApiError(
                401, "The sign-in was refused: its code is not valid or was used.", "invalid_grant"
            )
        claims = await self.verify(body.get("id_token", ""))
        if not secrets.compare_digest(str(claims.get("nonce", "")), nonce):
            raise ApiError(
                401, "The sign-in's ID token is not for this sign-in (nonce).", "invalid_token"
            )
        return Tokens(claims, body.get("refresh_token"))

    async def refresh(self, token: str) -> Tokens:
        """New tokens for a session still allowed at the provider; Refused when it is not."""
        body = await self._token({"grant_type": "refresh_token", "refresh_token": token})
        if body is None:
            raise Refused()
        claims = await self.verify(body["id_token"]) if body.get("id_token") else {}
        return Tokens(claims, body.get("refresh_token") or token)

    async def revoke(self, token: str) -> None:
        """End the provider's session behind a refresh token (best effort: the session here is gone anyway)."""
        meta = await self.meta()
        if "revocation_endpoint" in meta:
            form = {"token": token, "token_type_hint": "refresh_token"}
            try:
                await self._http.post(meta["revocation_endpoint"], data=form, auth=self._auth())
            except httpx.HTTPError:
                pass

    async def verify(self, token: str) -> dict[str, Any]:
        await self.meta()
        assert self._jwks is not None
        try:
            header = jwt.get_unverified_header(token)
            if header.get("alg") not in ASYMMETRIC:
                raise jwt.InvalidAlgorithmError(f"algorithm {header.get('alg')!r} is not allowed")
            key = await asyncio.to_thread(self._jwks.get_signing_key_from_jwt, token)
            return dict(
                jwt.decode(
                    token,
                    key.key,
                    algorithms=ASYMMETRIC,
                    audience=self.client_id,
                    issuer=self.issuer,
                    leeway=30,
                    options={"require": ["exp", "iat", "sub", "iss", "aud"]},
                )
            )
        except jwt.ExpiredSignatureError as exc:
            raise ApiError(
                401, "The identity provider's token has expired.", "expired_token"
            ) from exc
        except (jwt.PyJWTError, jwt.PyJWKClientError) as exc:
            raise ApiError(
                401, f"The identity provider's token is not valid: {exc}", "invalid_token"
            ) from exc

    async def _token(self, form: dict[str, str]) -> dict[str, Any] | None:
        """The token endpoint's answer; None when it refuses the grant (400/401)."""
        url = (await self.meta())["token_endpoint"]
        try:
            response = await self._http.post(url, data=form, auth=self._auth())
        except httpx.HTTPError as exc:
            raise unavailable() from exc
        if response.status_code in (400, 401):
            return None
        if response.status_code != 200:
            raise unavailable()
        return dict(response.json())

    def _auth(self) -> httpx.BasicAuth:
        return httpx.BasicAuth(self.client_id, self._secret)


def unavailable() -> ApiError:
    return ApiError(
        503,
        "The identity provider did not answer; try again shortly.",
        "identity_provider_unavailable",
        headers={"Retry-After": "5"},
    )
