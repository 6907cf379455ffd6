import time

import jwt
import pytest

from api.auth import issue, verify
from api.errors import ApiError

SECRET = "s" * 32


def test_issued_token_round_trips():
    p = verify(issue(SECRET, "alice", "pro", "iss", "aud"), SECRET, "iss", "aud")
    assert (p.user_id, p.tier) == ("alice", "pro")


@pytest.mark.parametrize(
    "token",
    [
        jwt.encode({"sub": "a", "tier": "pro", "iss": "iss", "aud": "aud", "exp": int(time.time()) - 5}, SECRET),
        jwt.encode({"sub": "a", "tier": "pro", "iss": "other", "aud": "aud", "exp": int(time.time()) + 60}, SECRET),
        jwt.encode({"sub": "a", "tier": "pro", "iss": "iss", "aud": "other", "exp": int(time.time()) + 60}, SECRET),
        jwt.encode({"sub": "a", "tier": "gold", "iss": "iss", "aud": "aud", "exp": int(time.time()) + 60}, SECRET),
        jwt.encode({"sub": "a", "tier": "pro", "iss": "iss", "aud": "aud", "exp": int(time.time()) + 60}, "x" * 32),
        "not-a-jwt",
    ],
)
def test_bad_credentials_are_401(token):
    with pytest.raises(ApiError) as err:
        verify(token, SECRET, "iss", "aud")
    assert err.value.status == 401


def test_unknown_tier_cannot_be_issued():
    with pytest.raises(ValueError):
        issue(SECRET, "a", "gold", "iss", "aud")
