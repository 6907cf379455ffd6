"""Reading a document as the memory stage does (processors/read_documents.py), per page, for each file type: the
text extracted by its library, cut into passages, each counted with the serving tokenizer and embedded with the
shared encoder. Every type carries the same text (a page: about 2,000 characters in paragraphs), made here by the
library that writes it, so the formats compare beside plain text in the same run; rounds interleave the types.

Prints JSON, writes bench/results/documents.json.
Usage: python bench/documents.py [--pages 40] [--rounds 3]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from docx import Document  # noqa: E402
from fpdf import FPDF  # noqa: E402
from measure import summary  # noqa: E402
from openpyxl import Workbook  # noqa: E402
from pptx import Presentation  # noqa: E402
from pptx.util import Inches  # noqa: E402

from conversation import tokens  # noqa: E402
from conversation.documents import Limits, extract, passages  # noqa: E402
from safety.encoder import Encoder  # noqa: E402

WORDS = "harbour lighthouse ferry island timetable engineer lamp keeper tide morning granite signal".split()


def page_text(rng: random.Random, page: int) -> list[str]:
    paragraphs = []
    for _ in range(5):
        words = [rng.choice(WORDS) for _ in range(60)]
        paragraphs.append(f"Page {page}. " + " ".join(words).capitalize() + ".")
    return paragraphs


def made(pages: list[list[str]]) -> dict[str, tuple[str, bytes]]:
    pdf = FPDF()
    pdf.set_font("helvetica", size=10)
    for paragraphs in pages:
        pdf.add_page()
        pdf.multi_cell(0, 5, "\n\n".join(paragraphs))
    docx = Document()
    for paragraphs in pages:
        for text in paragraphs:
            docx.add_paragraph(text)
    deck = Presentation()
    for paragraphs in pages:
        slide = deck.slides.add_slide(deck.slide_layouts[6])
        slide.shapes.add_textbox(Inches(0.5), Inches(0.5), Inches(9), Inches(6)).text_frame.text = "\n".join(paragraphs)
    book = Workbook()
    book.remove(book.active)
    for i, paragraphs in enumerate(pages):
        sheet = book.create_sheet(f"Sheet{i + 1}")
        for text in paragraphs:
            sheet.append(text.split(". ", 1))
    out: dict[str, tuple[str, bytes]] = {"pdf": ("b.pdf", bytes(pdf.output()))}
    for kind, thing in (("docx", docx), ("pptx", deck), ("xlsx", book)):
        buf = io.BytesIO()
        thing.save(buf)
        out[kind] = (f"b.{kind}", buf.getvalue())
    rows = io.StringIO()
    writer = csv.writer(rows)
    for paragraphs in pages:
        for text in paragraphs:
            writer.writerow(text.split(". ", 1))
    out["csv"] = ("b.csv", rows.getvalue().encode())
    out["markdown"] = (
        "b.md",
        "\n\n".join(f"## Page {i + 1}\n\n" + "\n\n".join(p) for i, p in enumerate(pages)).encode(),
    )
    body = "".join(f"<h2>Page {i + 1}</h2>" + "".join(f"<p>{t}</p>" for t in p) for i, p in enumerate(pages))
    out["html"] = ("b.html", f"<html><body>{body}</body></html>".encode())
    out["text (baseline)"] = ("b.txt", "\n\n".join("\n\n".join(p) for p in pages).encode())
    return out


def read(name: str, data: bytes, counter: Any, encoder: Encoder) -> tuple[float, float, int]:
    """(extraction ms, indexing ms: passages counted and embedded, passages)."""
    started = time.perf_counter()
    _, sections = extract(name, data, Limits(max_pages=1000))
    extracted = time.perf_counter()
    found = passages(sections, 800)
    for start in range(0, len(found), 32):
        batch = [p.text for p in found[start : start + 32]]
        encoder.embed(batch)
        for text in batch:
            counter.count(text)
    return (extracted - started) * 1000, (time.perf_counter() - extracted) * 1000, len(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(7)
    files = made([page_text(rng, i + 1) for i in range(args.pages)])
    counter, encoder = tokens.load("gguf:"), Encoder()
    read("w.txt", b"warm up the encoder", counter, encoder)
    times: dict[str, dict[str, list[float]]] = {k: {"extract": [], "index": []} for k in files}
    found: dict[str, int] = {}
    for _ in range(args.rounds):
        order = list(files)
        rng.shuffle(order)
        for kind in order:
            name, data = files[kind]
            extract_ms, index_ms, n = read(name, data, counter, encoder)
            times[kind]["extract"].append(extract_ms / args.pages)
            times[kind]["index"].append(index_ms / args.pages)
            found[kind] = n
    per_page = {
        kind: {
            "extract_ms_per_page": summary(t["extract"])["p50"],
            "index_ms_per_page": summary(t["index"])["p50"],
            "passages": found[kind],
            "bytes": len(files[kind][1]),
        }
        for kind, t in times.items()
    }
    base = per_page["text (baseline)"]["extract_ms_per_page"] or 0.001
    for row in per_page.values():
        row["extract_over_text"] = round(row["extract_ms_per_page"] / base, 1)
    result = {
        "bench": "documents",
        "date": time.strftime("%Y-%m-%d"),
        "pages": args.pages,
        "rounds": args.rounds,
        "per_page_p50": per_page,
        "note": "extract: the format's library; index: passages of 800 characters counted and embedded (MiniLM, "
        "one thread); a page is 5 paragraphs, about 2,100 characters",
    }
    text = json.dumps(result, indent=2)
    print(text)
    (ROOT / "bench" / "results" / "documents.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
