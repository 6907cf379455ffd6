"""A document's text as the model will read it: extracted from PDF, DOCX, PPTX, XLSX, CSV, Markdown, HTML or
plain text within limits, then cut into passages that keep their place (page, slide, sheet, heading) so an
answer can name where it read something.

What a file is comes from its bytes, not its name: a name that says one kind over bytes of another is refused
as mislabelled, an image is refused (the served models read text), and an Office file (a zip archive) has its
members' sizes and compression ratios checked before any is opened, so a zip bomb is refused unread. Each
refusal is a `Refused` with a code and a sentence for the person who sent the file. The libraries are the
well-kept ones for each format (pypdf, python-docx, python-pptx, openpyxl, lxml), each imported where its
format is read: the edge, which only screens a file, loads pypdf alone. Nothing here runs OCR.
"""

from __future__ import annotations

import csv
import io
import re
import zipfile
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

KINDS = ("pdf", "docx", "pptx", "xlsx", "csv", "markdown", "html", "text")
EXTENSIONS = {
    ".pdf": "pdf",
    ".docx": "docx",
    ".pptx": "pptx",
    ".xlsx": "xlsx",
    ".csv": "csv",
    ".md": "markdown",
    ".markdown": "markdown",
    ".html": "html",
    ".htm": "html",
    ".txt": "text",
}
OFFICE = {"word/document.xml": "docx", "ppt/presentation.xml": "pptx", "xl/workbook.xml": "xlsx"}
IMAGES = (b"\x89PNG", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM")
OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # legacy Office, and encrypted OOXML (stored inside one)


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 20 * 1024 * 1024
    max_pages: int = 300  # pages, slides or sheets
    max_rows: int = 20_000  # rows of a sheet or a CSV
    max_chars: int = 2_000_000  # of extracted text
    max_unzipped: int = 200 * 1024 * 1024  # an Office file's members together
    max_ratio: int = 100  # a member's uncompressed size over its compressed size


class Refused(ValueError):
    """A file that is not taken, and why, in words for the person who sent it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class Section:
    where: str  # "page 3", "slide 2", "sheet Budget", a heading, or ""
    text: str


@dataclass(frozen=True)
class Passage:
    index: int
    where: str
    text: str


def kind_of(name: str, data: bytes, limits: Limits = Limits()) -> str:
    """The file's kind from its bytes; refused when empty, too large, an image, of another kind than its name
    says, or not one of KINDS."""
    if not data.strip():
        raise Refused("empty_file", f"{name} is empty.")
    if len(data) > limits.max_bytes:
        mib = limits.max_bytes // (1024 * 1024)
        raise Refused("file_too_large", f"{name} is over the {mib} MiB a document may be.")
    named = EXTENSIONS.get(PurePath(name).suffix.lower())
    found = sniffed(name, data, named)
    if named is not None and named != found:
        raise Refused(
            "mislabelled_file", f"{name} is named a {named} file but holds a {found} file."
        )
    return found


TEXTUAL = {"csv", "markdown", "html", "text"}


def sniffed(name: str, data: bytes, named: str | None) -> str:
    if data.startswith(b"%PDF-"):
        return "pdf"
    if data.startswith(IMAGES) or data[8:12] == b"WEBP":
        raise Refused(
            "unsupported_content", f"{name} is an image; this deployment's models read text only."
        )
    if data.startswith(OLE):
        if named in ("docx", "pptx", "xlsx"):
            raise Refused("encrypted_file", f"{name} is protected by a password; remove it first.")
        raise Refused(
            "unsupported_type", f"{name} is a legacy Office file: save it as DOCX, PPTX or XLSX."
        )
    if data.startswith(b"PK\x03\x04"):
        try:
            members = set(zipfile.ZipFile(io.BytesIO(data)).namelist())
        except zipfile.BadZipFile:
            raise Refused("corrupt_file", f"{name} is damaged: it could not be opened.") from None
        for member, kind in OFFICE.items():
            if member in members:
                return kind
        raise Refused("unsupported_type", f"{name} is an archive, not a document.")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise Refused("unsupported_type", f"{name} is not a document this can read.") from None
    if "\x00" in text:
        raise Refused("unsupported_type", f"{name} is not a document this can read.")
    head = text[:512].lstrip().lower()
    if named is None and head.startswith(("<!doctype html", "<html")):
        return "html"
    return named if named in TEXTUAL else "text"


def extract(name: str, data: bytes, limits: Limits = Limits()) -> tuple[str, list[Section]]:
    """(kind, sections of text). Refused as `kind_of` refuses, and when encrypted, damaged, over the page or
    text limits, or with no text at all (a PDF of scans: OCR is not done)."""
    kind = kind_of(name, data, limits)
    if kind in ("docx", "pptx", "xlsx"):
        check_archive(name, data, limits)
    try:
        sections = READERS[kind](name, data, limits)
    except Refused:
        raise
    except Exception as exc:  # the libraries raise their own kinds on a damaged file
        raise Refused("corrupt_file", f"{name} is damaged: {type(exc).__name__}.") from None
    sections = [Section(s.where, tidy(s.text)) for s in sections if s.text.strip()]
    if not sections:
        if kind == "pdf":
            raise Refused(
                "no_text_layer",
                f"{name} has no text layer (scanned pages?); text cannot be read from images here.",
            )
        raise Refused("empty_file", f"{name} holds no text.")
    if sum(len(s.text) for s in sections) > limits.max_chars:
        raise Refused(
            "file_too_large", f"{name} holds over {limits.max_chars:,} characters of text."
        )
    return kind, sections


def screened(name: str, data: bytes, limits: Limits = Limits()) -> str:
    """The checks that cost little, made before a file is stored (its kind, an archive's sizes, a PDF's
    password and page count): what `extract` would refuse at once is refused at the door."""
    kind = kind_of(name, data, limits)
    if kind in ("docx", "pptx", "xlsx"):
        check_archive(name, data, limits)
    if kind == "pdf":
        try:
            pdf_reader(name, data, limits)
        except Refused:
            raise
        except Exception as exc:  # pypdf's own kinds, on a damaged file
            raise Refused("corrupt_file", f"{name} is damaged: {type(exc).__name__}.") from None
    return kind


def check_archive(name: str, data: bytes, limits: Limits) -> None:
    try:
        infos = zipfile.ZipFile(io.BytesIO(data)).infolist()
    except zipfile.BadZipFile:
        raise Refused("corrupt_file", f"{name} is damaged: it could not be opened.") from None
    total = 0
    for info in infos:
        total += info.file_size
        ratio = info.file_size / max(info.compress_size, 1)
        if total > limits.max_unzipped or (
            info.file_size > 1024 * 1024 and ratio > limits.max_ratio
        ):
            raise Refused(
                "zip_bomb", f"{name} unpacks to far more than it holds; it is not opened."
            )


def tidy(text: str) -> str:
    text = re.sub(r"[ \t\r\f\v]+", " ", text)
    return re.sub(r"\n\s*\n+", "\n\n", text).strip()


def pages_over(name: str, count: int, what: str, limits: Limits) -> None:
    if count > limits.max_pages:
        raise Refused("too_many_pages", f"{name} has {count} {what}; at most {limits.max_pages}.")


def pdf_reader(name: str, data: bytes, limits: Limits) -> Any:
    """The PDF opened, refused when it wants a password or has too many pages."""
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted and not reader.decrypt(""):
        raise Refused("encrypted_file", f"{name} is protected by a password; remove it first.")
    pages_over(name, len(reader.pages), "pages", limits)
    return reader


def read_pdf(name: str, data: bytes, limits: Limits) -> list[Section]:
    reader = pdf_reader(name, data, limits)
    return [
        Section(f"page {i}", page.extract_text() or "") for i, page in enumerate(reader.pages, 1)
    ]


def read_docx(name: str, data: bytes, limits: Limits) -> list[Section]:
    from docx import Document

    document = Document(io.BytesIO(data))
    sections: list[Section] = []
    heading, lines = "", list[str]()
    for paragraph in document.paragraphs:
        if paragraph.style is not None and paragraph.style.name.lower().startswith("heading"):
            sections.append(Section(heading, "\n".join(lines)))
            heading, lines = paragraph.text.strip(), []
        lines.append(paragraph.text)
    sections.append(Section(heading, "\n".join(lines)))
    for i, table in enumerate(document.tables, 1):
        rows = [" | ".join(cell.text.strip() for cell in row.cells) for row in table.rows]
        sections.append(Section(f"table {i}", "\n".join(rows[: limits.max_rows])))
    return sections


def read_pptx(name: str, data: bytes, limits: Limits) -> list[Section]:
    from pptx import Presentation

    slides = list(Presentation(io.BytesIO(data)).slides)
    pages_over(name, len(slides), "slides", limits)
    out = []
    for i, slide in enumerate(slides, 1):
        texts = [shape.text_frame.text for shape in slide.shapes if shape.has_text_frame]
        out.append(Section(f"slide {i}", "\n".join(texts)))
    return out


def read_xlsx(name: str, data: bytes, limits: Limits) -> list[Section]:
    from openpyxl import load_workbook

    book = load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    pages_over(name, len(book.worksheets), "sheets", limits)
    out = []
    for sheet in book.worksheets:
        rows = []
        for row in sheet.iter_rows(values_only=True, max_row=limits.max_rows):
            cells = ["" if v is None else str(v) for v in row]
            if any(cells):
                rows.append(" | ".join(cells).rstrip(" |"))
        out.append(Section(f"sheet {sheet.title}", "\n".join(rows)))
    return out


def read_csv(name: str, data: bytes, limits: Limits) -> list[Section]:
    reader = csv.reader(io.StringIO(data.decode("utf-8-sig")))
    rows = [" | ".join(row) for _, row in zip(range(limits.max_rows), reader, strict=False)]
    return [Section("", "\n".join(rows))]


def read_html(name: str, data: bytes, limits: Limits) -> list[Section]:
    from lxml import html

    root = html.document_fromstring(data.decode("utf-8-sig"))
    for node in root.xpath("//script|//style|//noscript"):
        node.drop_tree()
    for node in root.xpath("//p|//div|//br|//li|//h1|//h2|//h3|//h4|//tr"):
        node.tail = "\n" + (node.tail or "")
    return [Section("", root.text_content())]


def read_text(name: str, data: bytes, limits: Limits) -> list[Section]:
    return [Section("", data.decode("utf-8-sig"))]


READERS = {
    "pdf": read_pdf,
    "docx": read_docx,
    "pptx": read_pptx,
    "xlsx": read_xlsx,
    "csv": read_csv,
    "markdown": read_text,
    "html": read_html,
    "text": read_text,
}


def passages(sections: list[Section], max_chars: int = 1200) -> list[Passage]:
    """The text in passages of at most about `max_chars`, split at paragraphs (at lines, then words, when one
    is longer), each with its section's place."""
    out: list[Passage] = []
    for section in sections:
        current = ""
        for piece in pieces(section.text, max_chars):
            if current and len(current) + len(piece) + 2 > max_chars:
                out.append(Passage(len(out), section.where, current))
                current = ""
            current = f"{current}\n\n{piece}" if current else piece
        if current:
            out.append(Passage(len(out), section.where, current))
    return out


def pieces(text: str, max_chars: int) -> list[str]:
    found = []
    for paragraph in text.split("\n\n"):
        while len(paragraph) > max_chars:
            cut = paragraph.rfind("\n", 0, max_chars)
            if cut <= 0:
                cut = paragraph.rfind(" ", 0, max_chars)
            if cut <= 0:
                cut = max_chars
            found.append(paragraph[:cut].strip())
            paragraph = paragraph[cut:].strip()
        if paragraph:
            found.append(paragraph)
    return found
