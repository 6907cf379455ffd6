// What every view shares: the one mutable state of the page, DOM helpers, and the few calls a view makes to a
// view above it (`actions`, filled in by main.js), so the views import each other in one direction only.

export const THEME_KEY = "parley.theme";
export const PAGE = 20; // chats listed at a time
export const EXPIRED = "Your session has ended. Sign in again.";

export const state = {
  api: null,
  me: null,
  chats: [],
  nextCursor: null,
  archived: false, // the sidebar lists the archived chats
  chatId: null, // the open chat; null: a new chat, created when its first message is sent
  messages: [], // the open chat's stored messages, oldest first
  live: null, // {chatId, run, controller, el, announcer}: the answer streaming into the open chat
  opening: 0, // which openChat call is current (a slower earlier one must not draw over a later one)
  capacityTimer: null,
  models: [], // /v1/models: the picker's options
  pendingModel: null, // the model picked for a new chat before it is made
  chatSettings: { chat: null, model: null, instructions: "" }, // the open chat's (settings.js)
};

/** Calls up the views (set by main.js): the sidebar opens chats, an answer's actions regenerate it. */
export const actions = {
  openChat: async (_chatId, _options) => {},
  newChat: (_options) => {},
  stream: async (_chatId, _open, _options) => null,
  regenerate: async (_message) => {},
  answered: async () => {}, // after an answer ends: the budget notice
  resubmit: async (_message, _text) => {}, // an edited message sent again, as a new branch
  showBranch: async (_messageId) => {}, // another version of a message, and the branch through it
  showDocuments: async (_chatId) => {}, // the open chat's documents (documents.js); null: none open
};

export const $ = (selector) => document.querySelector(selector);

/** An element with attributes (on* are listeners) and children (strings become text). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) if (child !== null && child !== undefined) el.append(child);
  return el;
}

/** The chat a path addresses (`/c/{id}`), or null. */
export function chatOfPath(path) {
  return /^\/c\/([0-9a-f-]{36})$/.exec(path)?.[1] ?? null;
}

/** The open chat's title, in its header and the browser's tab. */
export function showTitle(title) {
  $("#chat-title").textContent = title ?? "New chat";
  document.title = title ? `${title} · Parley` : "Parley";
}

/** A moderation category as people read it. */
export function categoryLabel(category) {
  return category ? ` (${category.replaceAll("_", " ")})` : "";
}
