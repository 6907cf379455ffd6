"""A chat's branches at the edge (the tree itself: storage/tree.py): where a new message goes, which branch a
listing shows, and the branch a person chooses. The current branch is the one through the message the person
chose (`PUT .../branch`), else the one through the newest message; sending or regenerating makes the new
message's branch current again."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from api.errors import ApiError
from storage.conversations import Conversations
from storage.ids import parse_id
from storage.preferences import Preferences
from storage.rows import Chat, Message
from storage.tree import ROOT_ID, branch, children, leaf, parents, shown

MOST_MESSAGES = 20_000  # a listing reads the whole chat: its tree decides what a page holds


@dataclass(frozen=True)
class Tree:
    parent_of: dict[str, str]
    kids: dict[str, list[str]]
    roles: dict[str, str]

    def has(self, message_id: str) -> bool:
        return message_id in self.parent_of

    def siblings(self, message_id: str) -> list[str]:
        return self.kids.get(self.parent_of[message_id], [message_id])


async def tree_of(conversations: Conversations, chat_id: uuid.UUID) -> Tree:
    rows = await conversations.skeleton(chat_id)
    parent_of = parents(rows)
    return Tree(parent_of, children(parent_of), {i: role for i, _, role in rows})


def chosen(tree: Tree, message_id: str, param: str) -> str:
    """A message id of this chat, as given in `param` (400 message_not_found for any other: the chat is there,
    the request names something it does not have)."""
    parsed = parse_id(message_id)
    if parsed is None or not tree.has(str(parsed)):
        raise ApiError(400, f"This chat has no message {message_id}.", "message_not_found", param)
    return str(parsed)


async def parent_for(
    conversations: Conversations,
    chosen_branch: uuid.UUID | None,
    chat: Chat,
    parent_id: str | None,
    given: bool,
) -> tuple[str, bool]:
    """(the parent of a new message, whether the person had chosen a branch): the answer named (`given`;
    None: the root, a new first message), else the end of the current branch. A parent must be an answer of
    this chat (400 parent_not_found)."""
    selected = chosen_branch
    if given:
        if parent_id is None:
            return ROOT_ID, selected is not None
        parsed = parse_id(parent_id)
        found = await conversations.get_message(chat.chat_id, parsed) if parsed else None
        if found is None or found.role != "assistant":
            raise ApiError(
                400,
                "parent_id names no answer of this chat (a new message follows an answer, or null for the start).",
                "parent_not_found",
                "parent_id",
            )
        return found.id, selected is not None
    latest = chat.last_run_id or ROOT_ID  # the chat's latest answer (stored, or about to be)
    if selected is None:
        return latest, False
    tree = await tree_of(conversations, chat.chat_id)
    if not tree.has(str(selected)):
        return latest, True
    end = leaf(tree.kids, str(selected))
    return (end if tree.roles.get(end) == "assistant" else tree.parent_of[end]), True


async def listed_branch(
    conversations: Conversations, preferences: Preferences, chat_id: uuid.UUID, through: str | None
) -> tuple[list[Message], Tree, set[str]]:
    """(the branch through `through` (None: the current one) as the person left its messages, root first;
    the chat's tree; the ids of its messages not deleted)."""
    tree = await tree_of(conversations, chat_id)
    if through is not None:
        through = chosen(tree, through, "branch")
    else:
        selected = (await preferences.chat(chat_id)).branch
        through = str(selected) if selected is not None and tree.has(str(selected)) else None
    path = branch(tree.parent_of, through)
    shown = {m.id: m for m in await conversations.list_messages(chat_id, MOST_MESSAGES, None)}
    return [shown[i] for i in path if i in shown], tree, set(shown)


def branches(chat: Chat, parent: str) -> bool:
    """Whether a new message after `parent` leaves the chat's one line: it follows something other than the
    chat's latest answer (an edit sent again, a chosen branch)."""
    return parent != (chat.last_run_id or ROOT_ID)


def parent_shown(tree: Tree, message_id: str) -> str | None:
    return shown(tree.parent_of.get(message_id))
