// The sidebar: the user's chats, pinned ones first, then most recently active first, a page at a time, with
// pin, archive, rename and delete; or their archived chats, each with a way back.
import { icon } from "./icons.js";
import { announce, closeSidebar, guarded, showBanner } from "./page.js";
import { $, actions, h, PAGE, showTitle, state } from "./state.js";

export async function loadChats(more = false) {
  const cursor = more ? state.nextCursor : null;
  const page = await guarded(() => state.api.chats(cursor, PAGE, state.archived));
  const known = (c) => state.chats.some((k) => k.id === c.id);
  state.chats = more ? [...state.chats, ...page.data.filter((c) => !known(c))] : page.data;
  state.nextCursor = page.next_cursor;
  renderChats();
}

export function renderChats() {
  $("#chat-list").replaceChildren(...state.chats.map(chatItem));
  $("#more-chats").hidden = !state.nextCursor;
  $("#no-chats").hidden = state.chats.length > 0;
  $("#no-chats").textContent = state.archived ? "No archived chats." : "No chats yet.";
  $("#archived").setAttribute("aria-pressed", String(state.archived));
  $("#archived").textContent = state.archived ? "Back to chats" : "Archived chats";
}

/** Pin or archive a chat (or take it back), then list the chats again. */
async function mark(chat, patch, said) {
  try {
    await guarded(() => state.api.changeChat(chat.id, patch));
  } catch (error) {
    showBanner(`Could not change the chat: ${error.message}`);
    return;
  }
  announce(said);
  await loadChats();
}

export function wireArchive() {
  $("#archived").addEventListener("click", async () => {
    state.archived = !state.archived;
    await loadChats();
  });
}

/** The chat just answered moves to the top. */
export function bumpChat(chatId) {
  const at = state.chats.findIndex((c) => c.id === chatId);
  if (at > 0) state.chats.unshift(...state.chats.splice(at, 1));
  renderChats();
}

function chatItem(chat) {
  const current = chat.id === state.chatId;
  const open = (event) => {
    event.preventDefault();
    closeSidebar();
    actions.openChat(chat.id);
  };
  const link = h(
    "a",
    {
      class: "chat-link",
      href: `/c/${chat.id}`,
      "aria-current": current ? "page" : null,
      onclick: open,
    },
    chat.title,
  );
  const button = (label, name, onclick) =>
    h(
      "button",
      {
        class: "icon",
        type: "button",
        title: label,
        "aria-label": `${label} “${chat.title}”`,
        onclick,
      },
      icon(name),
    );
  const rename = button("Rename", "pencil", () => startRename(item, chat));
  const remove = button("Delete", "trash", () => confirmDelete(chat));
  const pin = button(chat.pinned ? "Unpin" : "Pin", "pin", () =>
    mark(chat, { pinned: !chat.pinned }, `${chat.pinned ? "Unpinned" : "Pinned"} “${chat.title}”.`),
  );
  pin.setAttribute("aria-pressed", String(Boolean(chat.pinned)));
  const archive = button(chat.archived ? "Unarchive" : "Archive", "archive", () =>
    mark(
      chat,
      { archived: !chat.archived },
      `${chat.archived ? "Unarchived" : "Archived"} “${chat.title}”.`,
    ),
  );
  const classes = ["chat", current ? "current" : "", chat.pinned ? "pinned" : ""];
  const item = h(
    "li",
    { class: classes.join(" ").trim(), "data-chat-id": chat.id },
    link,
    pin,
    archive,
    rename,
    remove,
  );
  return item;
}

function startRename(item, chat) {
  const input = h("input", {
    class: "rename",
    value: chat.title,
    "aria-label": "Chat title",
    maxlength: "200",
  });
  let done = false;
  const finish = async (save) => {
    if (done) return;
    done = true;
    const title = input.value.trim();
    if (save && title && title !== chat.title) {
      try {
        await guarded(() => state.api.rename(chat.id, title));
        chat.title = title;
        if (chat.id === state.chatId) showTitle(title);
      } catch (error) {
        showBanner(`Could not rename the chat: ${error.message}`);
      }
    }
    renderChats();
    $(`[data-chat-id="${chat.id}"] .chat-link`)?.focus();
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") finish(true);
    if (event.key === "Escape") finish(false);
  });
  input.addEventListener("blur", () => finish(true));
  item.replaceChildren(input);
  input.focus();
  input.select();
}

function confirmDelete(chat) {
  const dialog = $("#confirm-delete");
  $("#confirm-delete-title").textContent = chat.title;
  dialog.returnValue = "";
  dialog.onclose = async () => {
    if (dialog.returnValue !== "delete") return;
    try {
      await guarded(() => state.api.remove(chat.id));
    } catch (error) {
      showBanner(`Could not delete the chat: ${error.message}`);
      return;
    }
    state.chats = state.chats.filter((c) => c.id !== chat.id);
    announce(`Deleted “${chat.title}”.`);
    if (chat.id === state.chatId) actions.newChat();
    else renderChats();
  };
  dialog.showModal();
}
