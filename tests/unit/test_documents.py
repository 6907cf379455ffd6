"""A document's text (conversation/documents.py): each format read by its library into sections that keep their
place, cut into passages; every bad file refused with a code and a reason, nothing half read. The files are made
here by the libraries that write them (fpdf2, python-docx, python-pptx, openpyxl, pypdf for encryption)."""

from __future__ import annotations

import io
import zipfile

import pytest
from docx import Document
from fpdf import FPDF
from openpyxl import Workbook
from pptx import Presentation
from pptx.util import Inches
from pypdf import PdfReader, PdfWriter

from conversation.documents import Limits, Refused, extract, passages


def pdf(*pages: str) -> bytes:
    doc = FPDF()
    doc.set_font("helvetica", size=12)
    for text in pages:
        doc.add_page()
        if text:
            doc.multi_cell(0, 8, text)
        else:
            doc.rect(20, 20, 50, 50)  # a drawing, no text: what a scan's page is to a text reader
    return bytes(doc.output())


def docx(heading: str, body: str) -> bytes:
    document = Document()
    document.add_paragraph("Opening words.")
    document.add_heading(heading, level=1)
    document.add_paragraph(body)
    table = document.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text, table.rows[0].cells[1].text = "Region", "North"
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def pptx(*titles: str) -> bytes:
    deck = Presentation()
    for title in titles:
        slide = deck.slides.add_slide(deck.slide_layouts[5])
        slide.shapes.title.text = title
        slide.shapes.add_textbox(Inches(1), Inches(2), Inches(4), Inches(1)).text_frame.text = f"Notes on {title}"
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def xlsx() -> bytes:
    book = Workbook()
    sheet = book.active
    sheet.title = "Budget"
    sheet.append(["Item", "Cost"])
    sheet.append(["Ferry", 120])
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def test_each_format_is_read_into_sections_that_keep_their_place():
    kind, sections = extract("report.pdf", pdf("The lighthouse opened in 1902.", "Its lamp burns oil."))
    assert kind == "pdf" and [s.where for s in sections] == ["page 1", "page 2"]
    assert "1902" in sections[0].text and "oil" in sections[1].text
    kind, sections = extract("notes.docx", docx("Ferries", "The ferry leaves at nine."))
    assert kind == "docx"
    assert ("Ferries", True) in [(s.where, "leaves at nine" in s.text) for s in sections]
    assert any(s.where == "table 1" and "Region | North" in s.text for s in sections)
    kind, sections = extract("deck.pptx", pptx("Harbour", "Tides"))
    assert kind == "pptx" and [s.where for s in sections] == ["slide 1", "slide 2"]
    assert "Notes on Tides" in sections[1].text
    kind, sections = extract("costs.xlsx", xlsx())
    assert kind == "xlsx" and sections[0].where == "sheet Budget" and "Ferry | 120" in sections[0].text
    assert extract("t.csv", b"a,b\n1,2\n")[1][0].text == "a | b\n1 | 2"
    assert extract("r.md", b"# Title\n\nSome *text*.")[0] == "markdown"
    kind, sections = extract("page.html", b"<html><script>x()</script><p>Tide tables</p><p>High at six</p></html>")
    assert kind == "html" and sections[0].text == "Tide tables\nHigh at six"
    assert extract("plain.txt", "Caf\u00e9 au lait".encode())[1][0].text == "Caf\u00e9 au lait"


def encrypted_pdf() -> bytes:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf("Secret plans."))))
    writer.encrypt("pass")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def bomb() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/document.xml", b"\0" * (50 * 1024 * 1024))  # 50 MiB of zeros in some 50 KiB
    return out.getvalue()


@pytest.mark.parametrize(
    ("name", "data", "code"),
    [
        ("empty.pdf", b"", "empty_file"),
        ("blank.txt", b"  \n ", "empty_file"),
        ("big.txt", b"x" * 2048, "file_too_large"),
        ("scan.pdf", pdf("", ""), "no_text_layer"),
        ("locked.pdf", encrypted_pdf(), "encrypted_file"),
        ("locked.docx", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 512, "encrypted_file"),
        ("old.doc", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 512, "unsupported_type"),
        ("cut.pdf", pdf("Some text.")[:200], "corrupt_file"),
        ("cut.docx", docx("A", "B")[:300], "corrupt_file"),
        ("bomb.docx", bomb(), "zip_bomb"),
        ("report.docx", pdf("Some text."), "mislabelled_file"),
        ("photo.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "unsupported_content"),
        ("photo.pdf", b"\xff\xd8\xff\xe0" + b"\0" * 64, "unsupported_content"),
        ("tool.exe", bytes(range(256)) * 4, "unsupported_type"),
        ("many.pdf", pdf(*[f"Page {i}." for i in range(4)]), "too_many_pages"),
    ],
)
def test_a_bad_file_is_refused_with_its_reason(name, data, code):
    with pytest.raises(Refused) as refused:
        extract(name, data, Limits(max_bytes=1024 * 1024 if name != "big.txt" else 1024, max_pages=3))
    assert refused.value.code == code and name in refused.value.message


def test_passages_split_at_paragraphs_and_keep_their_place():
    _, sections = extract("r.pdf", pdf("First paragraph.\n\n" + "word " * 400, "Second page."))
    found = passages(sections, max_chars=600)
    assert [p.index for p in found] == list(range(len(found)))
    assert all(len(p.text) <= 600 for p in found)
    assert found[0].where == "page 1" and found[-1].where == "page 2" and found[-1].text == "Second page."
    assert "".join(p.text for p in found).count("word") == 400  # nothing lost at the cuts
