"""Secrets and personal data taken out of what a person sends, before it reaches the model and the log: a safety
policy's `redact` kinds (safety/policy.py), applied by the edge to each message a person sends or edits and to
the user messages of an OpenAI-style request (api/redaction.py).

Card numbers (13 to 19 digits that pass the Luhn check), keys and tokens (the formats their issuers publish,
private key blocks, bearer tokens, a value assigned to a name like `password` or `api_key`) and e-mail addresses
are patterns here: short, and each one's false hits are measured on ordinary text (bench/redaction.py). Phone
numbers are found by libphonenumber (the `phonenumbers` port), which knows every country's numbering plan: a
pattern would take dates, versions and order numbers for phones.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import phonenumbers

KINDS = ("card", "secret", "email", "phone")
PLACEHOLDER = {
    "card": "[redacted card number]",
    "secret": "[redacted secret]",
    "email": "[redacted email]",
    "phone": "[redacted phone number]",
}

CARD = re.compile(r"(?<![\w-])\d(?:[ -]?\d){12,18}(?![\w-])")
EMAIL = re.compile(r"(?<![\w.+-])[\w.%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")
SECRETS = (
    re.compile(
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S
    ),
    re.compile(r"\b(?:sk|rk)-(?:proj-|ant-(?:api\d\d-)?)?[A-Za-z0-9_-]{20,}"),  # OpenAI, Anthropic
    re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"),  # Stripe
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),  # AWS access key ids
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}|\bgithub_pat_[A-Za-z0-9_]{30,}"),  # GitHub
    re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"),  # GitLab
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),  # Slack
    re.compile(r"\bAIza[0-9A-Za-z_-]{35}"),  # Google
    re.compile(r"\bhf_[A-Za-z0-9]{30,}"),  # Hugging Face
    re.compile(r"\beyJ[\w-]{8,}\.eyJ[\w-]{8,}\.[\w-]{8,}"),  # a JWT
)
# A value after a credential's name: only the value goes (`password: [redacted secret]`).
ASSIGNED = re.compile(
    r"(?i)\b(?:password|passwd|pwd|passphrase|secret|api[_-]?key|access[_-]?key|access[_-]?token|auth[_-]?token"
    r"|client[_-]?secret|private[_-]?key|token)\b[\"']?\s*[:=]\s*[\"']?([^\s\"',;]{6,})"
)
BEARER = re.compile(r"(?i)\b(?:bearer|token)\s+([A-Za-z0-9._~+/-]{20,}=*)")
URL_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^\s:/@]+:([^\s/@]+)@")

Span = tuple[int, int, str]  # start, end, kind


def luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


def cards(text: str, _region: str) -> Iterator[Span]:
    for m in CARD.finditer(text):
        digits = re.sub(r"\D", "", m.group())
        if 13 <= len(digits) <= 19 and luhn(digits) and len(set(digits)) > 1:
            yield m.start(), m.end(), "card"


def secrets(text: str, _region: str) -> Iterator[Span]:
    for pattern in SECRETS:
        yield from ((m.start(), m.end(), "secret") for m in pattern.finditer(text))
    for pattern in (ASSIGNED, BEARER, URL_PASSWORD):
        yield from ((m.start(1), m.end(1), "secret") for m in pattern.finditer(text))


def emails(text: str, _region: str) -> Iterator[Span]:
    yield from ((m.start(), m.end(), "email") for m in EMAIL.finditer(text))


def phones(text: str, region: str) -> Iterator[Span]:
    for m in phonenumbers.PhoneNumberMatcher(text, region, leniency=phonenumbers.Leniency.VALID):
        yield m.start, m.end, "phone"


FINDERS: dict[str, Callable[[str, str], Iterator[Span]]] = {
    "card": cards,
    "secret": secrets,
    "email": emails,
    "phone": phones,
}


@dataclass(frozen=True)
class Redacted:
    text: str
    kinds: tuple[str, ...]  # what was taken out, in KINDS order; empty: the text is as sent

    @property
    def changed(self) -> bool:
        return bool(self.kinds)


def redact(text: str, kinds: tuple[str, ...] | list[str], region: str = "US") -> Redacted:
    """The text with every span of the given kinds replaced by its placeholder (pure). Overlapping finds keep the
    one that starts first (at the same start a secret, else the longer: a URL's password is not an address);
    `region` is the country a phone number without its +code is read in."""
    if not kinds or not text:
        return Redacted(text, ())
    spans = sorted(
        (span for kind in KINDS if kind in kinds for span in FINDERS[kind](text, region)),
        key=lambda s: (s[0], s[2] != "secret", -s[1]),
    )
    out, at, found = [], 0, set()
    for start, end, kind in spans:
        if start < at:
            continue  # inside one already taken out
        out += [text[at:start], PLACEHOLDER[kind]]
        at = end
        found.add(kind)
    out.append(text[at:])
    return Redacted("".join(out), tuple(k for k in KINDS if k in found))
