"""Sharing a chat: a read-only snapshot of its current branch as it stood, by an unguessable link (`/s/{id}`),
readable by the deployment's signed-in people, or by anyone where the deployment allows public links and the
owner chose one. The owner lists and revokes their shares (then 404); deleting the chat revokes them too."""

from __future__ import annotations

import logging
import secrets
from datetime import UTC, datetime

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from api.auth import CurrentUser, MaybeUser
from api.branches import listed_branch
from api.chat_state import owned_chat
from api.deps import ConversationsDep, PreferencesDep, SettingsDep, SharesDep
from api.errors import ApiError
from api.openapi import SHARE_LINKS
from api.settings import ApiSettings
from storage.shares import Share

log = logging.getLogger(__name__)
router = APIRouter()


class NewShare(BaseModel):
    public: bool = Field(
        False,
        strict=True,
        description="readable without signing in (only where the deployment allows public links)",
    )


class ShareOut(BaseModel):
    id: str
    url: str = Field(
        description="the shared page's address: read only, for the deployment's signed-in people"
    )
    chat_id: str
    title: str
    public: bool = Field(description="readable without signing in")
    created_at: str


class ShareList(BaseModel):
    data: list[ShareOut]


class SharedMessage(BaseModel):
    role: str
    content: str
    created_at: str
    model: str | None = None


class SharedChat(BaseModel):
    id: str
    title: str
    created_at: str = Field(description="when it was shared: the snapshot's moment")
    messages: list[SharedMessage]


def share_out(share: Share, settings: ApiSettings, request: Request) -> ShareOut:
    base = (settings.public_url or str(request.base_url)).rstrip("/")
    return ShareOut(
        id=share.share_id,
        url=f"{base}/s/{share.share_id}",
        chat_id=str(share.chat_id),
        title=share.title,
        public=share.public,
        created_at=share.created_at.isoformat(),
    )


def gone() -> ApiError:
    return ApiError(404, "No such shared chat (it may have been revoked).", "share_not_found")


@router.post("/v1/chats/{chat_id}/share", status_code=201, responses={201: {"links": SHARE_LINKS}})
async def share_chat(
    conversations: ConversationsDep,
    preferences: PreferencesDep,
    shares: SharesDep,
    settings: SettingsDep,
    user: CurrentUser,
    request: Request,
    chat_id: str,
    body: NewShare | None = None,
) -> ShareOut:
    """A snapshot of the chat's current branch: later messages, edits and deletes do not reach it."""
    parsed, chat = await owned_chat(conversations, user, chat_id)
    public = bool(body and body.public)
    if public and not settings.public_shares:
        raise ApiError(
            403,
            "This deployment does not allow public links; a share is for its signed-in people.",
            "public_shares_disabled",
            "public",
        )
    path, _, _ = await listed_branch(conversations, preferences, parsed, None)
    if not path:
        raise ApiError(400, "This chat has no messages to share yet.", "empty_chat")
    at = datetime.now(UTC).replace(microsecond=0)
    messages = [
        {
            "role": m.role,
            "content": m.content,
            "created_at": m.created_at.isoformat(),
            "model": m.model,
        }
        for m in path
    ]
    share = Share(secrets.token_urlsafe(18), parsed, user.user_id, chat.title, public, at, messages)
    await shares.put(share)
    log.info(
        "chat %s shared by %s as %s (%d messages)",
        chat_id,
        user.user_id,
        share.share_id[:6],
        len(path),
    )
    return share_out(share, settings, request)


@router.get("/v1/me/shares")
async def my_shares(
    shares: SharesDep, settings: SettingsDep, user: CurrentUser, request: Request
) -> ShareList:
    """The person's shares, newest first."""
    mine = await shares.of_owner(user.user_id)
    return ShareList(data=[share_out(s, settings, request) for s in mine])


@router.delete("/v1/chats/{chat_id}/share/{share_id}", status_code=204)
async def revoke_share(
    conversations: ConversationsDep,
    shares: SharesDep,
    user: CurrentUser,
    chat_id: str,
    share_id: str,
) -> Response:
    parsed, _ = await owned_chat(conversations, user, chat_id)
    share = await shares.get(share_id)
    if share is None or share.owner != user.user_id or share.chat_id != parsed:
        raise gone()
    await shares.revoke(share)
    log.info("share %s of chat %s revoked by %s", share_id[:6], chat_id, user.user_id)
    return Response(status_code=204)


@router.get("/v1/shared/{share_id}")
async def read_share(shares: SharesDep, user: MaybeUser, share_id: str) -> SharedChat:
    """A shared chat, read only: for any signed-in person of the deployment (a public one: for anyone)."""
    share = await shares.get(share_id)
    if share is None:
        raise gone()
    if user is None and not share.public:
        raise ApiError(
            401,
            "Sign in to read this shared chat.",
            "missing_token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return SharedChat(
        id=share.share_id,
        title=share.title,
        created_at=share.created_at.isoformat(),
        messages=[SharedMessage(**m) for m in share.messages or []],
    )
