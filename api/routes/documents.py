"""Documents attached to a chat: `POST /v1/chats/{chat}/documents` (a multipart form's `file`), listed with how
their reading went, and deleted. The edge checks what costs little (its kind from its bytes, an Office file's
sizes, a PDF's password and pages) and stores the file; the memory stage reads it (processors/read_documents.py)
and the chat's next runs hold its passages (conversation/sources.py). A document is the chat's: it goes with
the chat and with its owner."""

from __future__ import annotations

import logging
import math
import uuid
from pathlib import PurePath
from typing import Literal

from fastapi import APIRouter, Response, UploadFile
from pydantic import BaseModel, Field

from api.auth import CurrentUser
from api.chat_state import memory_changed, owned_chat
from api.deps import ConversationsDep, DocumentsDep, ProducerDep, SettingsDep
from api.errors import ApiError
from conversation.documents import Limits, Refused, screened
from storage.documents import PART_BYTES, Document, Status
from storage.ids import new_id, now

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/chats")


class DocumentError(BaseModel):
    code: str
    message: str


class DocumentOut(BaseModel):
    id: str
    object: Literal["document"] = "document"
    name: str
    kind: str = Field(description="pdf, docx, pptx, xlsx, csv, markdown, html or text")
    size: int = Field(description="bytes")
    created_at: str
    status: Literal["reading", "ready", "failed"]
    error: DocumentError | None = Field(None, description="failed: why it could not be read")
    passages: int = Field(0, description="ready: the passages its text was cut into")
    characters: int = 0

    @classmethod
    def of(cls, d: Document, status: Status | None) -> DocumentOut:
        state = "reading" if status is None else status.state
        error = None
        if status is not None and status.state == "failed":
            error = DocumentError(code=status.code, message=status.message)
        return cls(
            id=str(d.document_id),
            name=d.name,
            kind=d.kind,
            size=d.size,
            created_at=d.created_at.isoformat(),
            status=state,
            error=error,
            passages=status.passages if status else 0,
            characters=status.chars if status else 0,
        )


class DocumentList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DocumentOut]


def file_name(given: str | None) -> str:
    name = PurePath((given or "").replace("\\", "/")).name.strip()
    return name[:200] or "document.txt"


@router.post("/{chat_id}/documents", status_code=201)
async def attach(
    conversations: ConversationsDep,
    store: DocumentsDep,
    producer: ProducerDep,
    settings: SettingsDep,
    user: CurrentUser,
    chat_id: str,
    file: UploadFile | None = None,
) -> DocumentOut:
    """Attach a file (PDF, DOCX, PPTX, XLSX, CSV, Markdown, HTML or text, up to the deployment's size): it is
    read in the background (`status` reading, then ready or failed with its reason); the chat's next answers
    hold its passages and cite them."""
    parsed, _ = await owned_chat(
        conversations, user, chat_id
    )  # before the form: 404 to anyone else
    if file is None:
        raise ApiError(
            400, "Send the document as a multipart form's `file`.", "file_required", "file"
        )
    if len(await store.listed(parsed)) >= settings.documents_per_chat:
        message = f"A chat holds at most {settings.documents_per_chat} documents; delete one first."
        raise ApiError(400, message, "too_many_documents", "file")
    limits = Limits(
        max_bytes=settings.document_max_mib * 1024 * 1024, max_pages=settings.document_max_pages
    )
    name = file_name(file.filename)
    data = await file.read(limits.max_bytes + 1)
    try:
        kind = screened(name, data, limits)
    except Refused as exc:
        status = 413 if exc.code == "file_too_large" else 400
        raise ApiError(status, exc.message, exc.code, "file") from None
    document = Document(
        parsed,
        new_id(),
        user.user_id,
        name,
        kind,
        len(data),
        math.ceil(len(data) / PART_BYTES),
        now(),
    )
    await store.put(document, data)
    await memory_changed(
        producer,
        parsed,
        user.user_id,
        "document_added",
        document_id=str(document.document_id),
    )
    log.info("chat %s: %s attached %s (%s, %d bytes)", chat_id, user.user_id, name, kind, len(data))
    return DocumentOut.of(document, None)


@router.get("/{chat_id}/documents")
async def documents(
    conversations: ConversationsDep, store: DocumentsDep, user: CurrentUser, chat_id: str
) -> DocumentList:
    """The chat's documents, oldest first, each with how its reading went."""
    parsed, _ = await owned_chat(conversations, user, chat_id)
    listed = await store.listed(parsed)
    statuses = await store.statuses(parsed)
    return DocumentList(data=[DocumentOut.of(d, statuses.get(d.document_id)) for d in listed])


@router.delete("/{chat_id}/documents/{document_id}", status_code=204)
async def detach(
    conversations: ConversationsDep,
    store: DocumentsDep,
    producer: ProducerDep,
    user: CurrentUser,
    chat_id: str,
    document_id: str,
) -> Response:
    """The document and what was read of it: the chat's next answers no longer hold it."""
    parsed, _ = await owned_chat(conversations, user, chat_id)
    try:
        found = await store.get(parsed, uuid.UUID(document_id))
    except ValueError:
        found = None
    if found is None:
        raise ApiError(404, f"No document '{document_id}' in this chat.", "document_not_found")
    await store.delete(found)
    await memory_changed(
        producer, parsed, user.user_id, "document_deleted", document_id=str(found.document_id)
    )
    return Response(status_code=204)
