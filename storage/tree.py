"""A chat as a tree of messages (pure): each message names its parent, the answer it follows (a user message) or
the question it answers (an answer). A branch is the path from the root to a leaf; editing and resubmitting a
question, or regenerating an answer, adds a sibling beside the old one, which stays reachable.

Messages stored before the tree (no parent) follow the message before them in time, so an old chat reads as one
branch; so does a message whose parent was never stored (an answer whose run was withdrawn or failed before it
was written), so that nothing after it drops out of its branch. A message at the root names ROOT as its parent."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence

from storage.ids import MIN_ID

ROOT = MIN_ID  # the parent of a chat's first message on a branch
ROOT_ID = str(ROOT)


def shown(parent: str | None) -> str | None:
    """A parent as clients see it: null at the root, and for a message stored before the tree."""
    return None if parent in (None, ROOT_ID) else parent


def parents(rows: Sequence[tuple[str, str | None, str]]) -> dict[str, str]:
    """Each message's parent id (ROOT_ID at the root), from (id, stored parent or None, role) in time order."""
    stored = {message_id for message_id, _, _ in rows}
    out: dict[str, str] = {}
    previous = ROOT_ID
    for message_id, parent, _ in rows:
        out[message_id] = parent if parent == ROOT_ID or parent in stored else previous
        previous = message_id
    return out


def before(rows: Sequence[tuple[str, str | None, str]], message_id: str) -> set[str]:
    """The ids on the branch up to a message, itself included."""
    return set(ancestors(parents(rows), message_id))


def children(parent_of: Mapping[str, str]) -> dict[str, list[str]]:
    """Each message's children, oldest first (ROOT_ID: the roots)."""
    out: dict[str, list[str]] = {}
    for message_id in sorted(parent_of, key=lambda i: uuid.UUID(i).time):
        out.setdefault(parent_of[message_id], []).append(message_id)
    return out


def ancestors(parent_of: Mapping[str, str], message_id: str) -> list[str]:
    """The path from the root to `message_id` (itself included), oldest first; a parent not stored ends it."""
    path: list[str] = []
    seen: set[str] = set()
    at = message_id
    while at in parent_of and at not in seen:
        seen.add(at)
        path.append(at)
        at = parent_of[at]
    return path[::-1]


def leaf(kids: Mapping[str, list[str]], message_id: str) -> str:
    """The end of the branch through `message_id`: from it, the newest child each step down."""
    at = message_id
    while kids.get(at):
        at = kids[at][-1]
    return at


def newest(parent_of: Mapping[str, str]) -> str | None:
    return max(parent_of, key=lambda i: uuid.UUID(i).time, default=None)


def branch(parent_of: Mapping[str, str], through: str | None) -> list[str]:
    """The branch through a message (None: through the newest message), root first."""
    start = through if through is not None else newest(parent_of)
    if start is None:
        return []
    return ancestors(parent_of, leaf(children(parent_of), start))


def siblings(
    parent_of: Mapping[str, str], kids: Mapping[str, list[str]], ids: Iterable[str]
) -> dict[str, list[str]]:
    """Each message's siblings (those sharing its parent, itself included, oldest first)."""
    return {i: kids.get(parent_of[i], [i]) for i in ids}
