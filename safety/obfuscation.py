"""The plain readings of an obfuscated text: what the heads should score besides the text as written.

Attackers hide a request from a classifier by spelling it so that the encoder no longer recognises the words:
leetspeak ("h0w t0 m4k3 a b0mb"), look-alike letters from other scripts ("bоmb" with a Cyrillic o), invisible
characters between letters, or the whole request encoded (base64, hex). An encoder trained on plain text reads
such a text as noise, so the heads gave it a score near 0 (leetspeak and base64 versions of HarmBench
requests: recall 0.03 and 0.0 at the warn bar). `readings` returns the plain text recovered from each of these
spellings; the moderator scores each one and takes the highest score, so a hidden request is scored as if it
were written plainly, while a text with nothing to undo costs no extra encoder pass.

Pure functions, no model. Transliteration of look-alike letters uses anyascii (ISC): only inside words that
mix Latin letters with letters of another script, so a text written wholly in Greek or Cyrillic is left as it
is (the heads read it as written).
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata

from anyascii import anyascii

# Leetspeak: a digit or symbol standing for a letter, undone only inside a word that also holds letters.
LEET = str.maketrans({"4": "a", "@": "a", "8": "b", "3": "e", "6": "g", "9": "g", "1": "i", "!": "i", "|": "l",
                      "0": "o", "5": "s", "$": "s", "7": "t", "+": "t", "2": "z"})  # fmt: skip
_LEET_WORD = re.compile(
    r"(?<![\w@$!|+])[\w@$!|+]{2,20}(?![\w@$!|+])"
)  # longer runs: codes, not words
_HAS_LEET = re.compile(r"[A-Za-z][0-9@$!|+]|[0-9@$!|+][A-Za-z]")
# A number with its ordinal or a unit ("3rd", "21st", "10am", "5km") is a word as written, not leetspeak ("erd"):
# read as leetspeak, every text with a date or a distance in it cost a second encoder pass for nothing. An
# ordinal counts only with its own suffix, so "4nd" (leetspeak "and") is still undone.
_ORDINAL = re.compile(r"(?:\d*[02-9])?(?:1st|2nd|3rd)|\d*(?:1\d|[04-9])th")
# Units of two letters or more only: a number and one letter is leetspeak as often ("53x", "45k", "4m").
_UNIT = re.compile(
    r"\d+(?:am|pm|kg|km|cm|mm|mg|ml|gb|mb|kb|tb|k?hz|[mg]hz|px|fps|mph|kph|kwh?)", re.I
)
_WORD = re.compile(r"\w+")
_BASE64 = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")
_HEX = re.compile(r"\b(?:[0-9a-fA-F]{2}[\s:]?){8,}")
# encoded runs decoded per text (a long text of random tokens is not decoded at length)
MAX_DECODED = 4


def _printable(text: str) -> bool:
    """Decoded bytes that read as text: mostly letters and spaces, not binary that happened to decode."""
    if len(text) < 6:
        return False
    good = sum(ch.isalpha() or ch.isspace() or ch in ".,;:?!'\"-()" for ch in text)
    return good / len(text) >= 0.85 and any(ch.isspace() for ch in text)


def _fold_word(match: re.Match[str]) -> str:
    word = match.group(0)
    scripts = {"latin" if "a" <= ch.lower() <= "z" else "other" for ch in word if ch.isalpha()}
    return anyascii(word) if scripts == {"latin", "other"} else word


def plain(text: str) -> str:
    """The text with compatibility forms folded (NFKC: fullwidth and mathematical letters), invisible
    characters removed, look-alike letters in mixed-script words transliterated and leetspeak undone."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(
        ch for ch in text if unicodedata.category(ch) != "Cf"
    )  # zero-width and other format chars
    text = _WORD.sub(_fold_word, text)
    return _LEET_WORD.sub(_unleet, text)


def _unleet(match: re.Match[str]) -> str:
    word = match.group(0)
    core = word.rstrip("!")  # a closing "!" is punctuation, not an i
    if _ORDINAL.fullmatch(core) or _UNIT.fullmatch(core) or not _HAS_LEET.search(core):
        return word
    return core.translate(LEET) + word[len(core) :]


def _decoded(text: str) -> list[str]:
    found: list[str] = []
    for run in _BASE64.findall(text):
        if len(found) >= MAX_DECODED:
            break
        raw = run.replace("-", "+").replace("_", "/")
        try:
            decoded = base64.b64decode(raw + "=" * (-len(raw) % 4)).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            continue
        if _printable(decoded):
            found.append(decoded)
    for run in _HEX.findall(text):
        if len(found) >= MAX_DECODED:
            break
        try:
            decoded = bytes.fromhex(re.sub(r"[\s:]", "", run)).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            continue
        if _printable(decoded):
            found.append(decoded)
    return found


def readings(text: str) -> list[str]:
    """The other texts to score for `text`: its plain form if that differs, and any encoded payload it carries,
    decoded (and made plain). Empty when there is nothing to undo."""
    out: list[str] = []
    folded = plain(text)
    if folded != text:
        out.append(folded)
    for decoded in _decoded(text):
        out.append(decoded)
        folded_decoded = plain(decoded)
        if folded_decoded != decoded:
            out.append(folded_decoded)
    return list(dict.fromkeys(out))
