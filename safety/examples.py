"""One training or evaluation text for the safety heads, with its label and the source it came from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    text: str
    label: int  # 1: the category applies
    source: str
