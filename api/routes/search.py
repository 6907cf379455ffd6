"""`GET /v1/search`: the caller's own messages, by words (ranked, highlighted, the last word matched as typed)
and by meaning. The metering stage holds the index (processors/search_index.py, storage/search.py); the edge
checks the query, asks for the caller's rows only, and keeps the hits of chats the caller still owns, with
their titles."""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Literal
from urllib.parse import quote

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from api.auth import CurrentUser
from api.deps import ConversationsDep, HttpDep, SettingsDep
from api.errors import ApiError
from api.routes.system import metering
from storage.search import MAX_QUERY_CHARS, MAX_TERMS
from storage.search import Query as Typed

router = APIRouter(prefix="/v1/search")


class SearchHit(BaseModel):
    chat_id: str
    chat_title: str
    message_id: str
    role: str
    snippet: str = Field(description="the message around its first matching word")
    highlights: list[tuple[int, int]] = Field(
        description="[start, end) of each matching word in the snippet"
    )
    score: float = Field(description="words: term-frequency rank; meaning: cosine similarity")
    match: Literal["words", "meaning"]
    created_at: int = Field(description="epoch ms")


class SearchResults(BaseModel):
    object: Literal["list"] = "list"
    data: list[SearchHit]


def checked(q: str) -> str:
    text = q.strip()
    terms = Typed.parse(text).terms
    if not terms:
        raise ApiError(400, "Type a word to search for.", "query_empty", "q")
    if len(text) > MAX_QUERY_CHARS or terms > MAX_TERMS:
        raise ApiError(
            400,
            f"A search takes at most {MAX_TERMS} words and {MAX_QUERY_CHARS} characters.",
            "query_too_long",
            "q",
        )
    return q.lstrip()  # a trailing space says the last word is whole


@router.get("")
async def search(
    settings: SettingsDep,
    http: HttpDep,
    conversations: ConversationsDep,
    user: CurrentUser,
    q: Annotated[str, Query(description="words; the last one is matched as typed so far")],
    mode: Annotated[
        Literal["all", "words", "meaning"],
        Query(description="words, meaning, or both (word hits first)"),
    ] = "all",
    limit: Annotated[int, Query(ge=1, le=50)] = 20,
) -> SearchResults:
    """The caller's messages that match, best first, each naming its chat and message (open the chat with
    `?branch=MESSAGE_ID` to show it on its branch). Never another person's; a deleted message or chat is
    not found."""
    params: dict[str, str | int] = {"q": checked(q), "mode": mode, "limit": limit}
    path = f"/search/{quote(user.user_id, safe='')}"
    found = await metering(settings, http, path, params, what=("Search", "search_unavailable"))
    hits = found["data"]
    chats = {h["chat_id"] for h in hits}
    rows = await asyncio.gather(*(conversations.get_chat(uuid.UUID(c)) for c in chats))
    titles = {
        str(r.chat_id): r.title or "" for r in rows if r is not None and r.user_id == user.user_id
    }
    return SearchResults(
        data=[
            SearchHit(**h, chat_title=titles[h["chat_id"]]) for h in hits if h["chat_id"] in titles
        ]
    )
