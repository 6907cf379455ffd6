"""Chats deleted by age: how many days a person's chats are kept, and the setting's bounds. The sweep itself,
on the real stack: tests/stack/test_chat_features.py."""

from __future__ import annotations

import pytest

from api.retention import days_kept


@pytest.mark.parametrize(
    ("chosen", "longest", "kept"),
    [(None, None, None), (30, None, 30), (None, 90, 90), (30, 90, 30), (120, 90, 90)],
)
def test_a_persons_chats_are_kept_their_days_at_most_the_deployments(chosen, longest, kept):
    assert days_kept(chosen, longest) == kept


def test_a_person_chooses_their_days_within_the_deployments_longest(edge):
    ada = edge.signed("ada")
    chosen = edge.http.patch("/v1/me/settings", json={"delete_after_days": 30}, headers=ada).json()
    assert (chosen["delete_after_days"], chosen["max_chat_age_days"], chosen["memories"]) == (30, None, True)
    assert edge.http.patch("/v1/me/settings", json={"memories": False}, headers=ada).json()["delete_after_days"] == 30
    for bad in (0, "30", 1.5, 643055905768132):
        assert edge.http.patch("/v1/me/settings", json={"delete_after_days": bad}, headers=ada).status_code == 400

    edge.app.state.settings = edge.app.state.settings.model_copy(update={"max_chat_age_days": 14})
    refused = edge.http.patch("/v1/me/settings", json={"delete_after_days": 30}, headers=ada)
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "delete_after_too_long")
    assert edge.http.get("/v1/me/settings", headers=ada).json()["delete_after_days"] == 30  # nothing written
    kept = edge.http.patch("/v1/me/settings", json={"delete_after_days": None}, headers=ada).json()
    assert (kept["delete_after_days"], kept["max_chat_age_days"]) == (None, 14)


def test_only_an_admin_sweeps(edge):
    refused = edge.http.post("/v1/admin/retention/sweep", headers=edge.signed("ada"))
    assert refused.status_code == 403
