// The sidebar: the user's chats, most recently active first, a page at a time, with rename and delete.
import { icon } from "./icons.js";
import { announce, closeSidebar, guarded, showBanner } from "./page.js";
import { $, actions, h, PAGE, showTitle, state } from "./state.js";

export async function loadChats(more = false) {
  const page = await guarded(() => state.api.chats(more ? state.nextCursor : null, PAGE));
  const known = (c) => state.chats.some((k) => k.id === c.id);
  state.chats = more ? [...state.chats, ...page.data.filter((c) => !known(c))] : page.data;
  state.nextCursor = page.next_cursor;
  renderChats();
}

export function renderChats() {
  $("#chat-list").replaceChildren(...state.chats.map(chatItem));
  $("#more-chats").hidden = !state.nextCursor;
  $("#no-chats").hidden = state.chats.length > 0;
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
  const item = h(
    "li",
    { class: current ? "chat current" : "chat", "data-chat-id": chat.id },
    link,
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
