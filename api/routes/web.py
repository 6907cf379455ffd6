"""The chat app (web/, built into web/dist by `make web`): its page at / and /c/{chat_id}, its assets under /app."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, Response

router = APIRouter(include_in_schema=False)

NOT_BUILT = """<!doctype html><meta charset="utf-8"><title>Parley</title>
<p>The chat app is not built on this server. Run <code>make web</code> (or <code>make run</code>, which builds it).</p>
<p>The API itself is up: <a href="/docs">/docs</a>.</p>"""


def page(request: Request) -> Response:
    """The app's one page; it never caches (its assets have content-hashed names and cache forever)."""
    index: Path = request.app.state.settings.web_dir / "index.html"
    if not index.is_file():
        return HTMLResponse(NOT_BUILT, status_code=503)
    return FileResponse(index, media_type="text/html", headers={"Cache-Control": "no-cache"})


@router.get("/")
async def home(request: Request) -> Response:
    return page(request)


@router.get("/c/{chat_id}")
async def chat_page(request: Request, chat_id: str) -> Response:
    """A chat's own address (the page opens the chat; a reload stays in it)."""
    return page(request)
