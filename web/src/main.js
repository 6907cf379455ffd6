// The chat app: sign in, the sidebar of chats, the conversation with streamed answers. Plain DOM, no framework:
// the page is one list of messages and one answer in flight, and every change to it is made here.
import DOMPurify from "dompurify";
import { Announcer } from "./announce.js";
import { Api, ApiError } from "./api.js";
import { follow } from "./follow.js";
import { drawIcons, icon } from "./icons.js";
import { toHtml } from "./markdown.js";
import { fromMessage, isFinished, newRun, toMessage } from "./run.js";

const TOKEN_KEY = "parley.token";
const THEME_KEY = "parley.theme";
const PAGE = 20;

const $ = (selector) => document.querySelector(selector);

/** An element with attributes (on* are listeners) and children (strings become text). */
function h(tag, attrs = {}, ...children) {
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

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

const state = {
  api: null,
  me: null,
  chats: [],
  nextCursor: null,
  chatId: null, // the open chat; null: a new chat, created when its first message is sent
  messages: [], // the open chat's stored messages, oldest first
  live: null, // {chatId, run, controller, el, announcer}: the answer streaming into the open chat
  opening: 0, // which openChat call is current (a slower earlier one must not draw over a later one)
  capacityTimer: null,
};

// -- sign in ------------------------------------------------------------------------------------------------

function tokenFromUrl() {
  const match = /(?:^#|&)token=([^&]+)/.exec(window.location.hash);
  if (!match) return null;
  history.replaceState(null, "", window.location.pathname + window.location.search); // not left in the address bar
  return decodeURIComponent(match[1]);
}

async function signIn(token, { quiet = false } = {}) {
  const api = new Api(token);
  try {
    state.me = await api.me();
  } catch (error) {
    if (!quiet) showSignIn(error.status === 401 ? "That credential was not accepted." : error.message);
    else showSignIn(error.status === 401 ? "Your credential has expired. Sign in again." : error.message);
    return;
  }
  state.api = api;
  localStorage.setItem(TOKEN_KEY, token);
  $("#signin").hidden = true;
  $("#app").hidden = false;
  $("#who").textContent = `${state.me.user_id} · ${state.me.tier}`;
  await loadChats();
  const match = /^\/c\/([0-9a-f-]{36})$/.exec(window.location.pathname);
  if (match) await openChat(match[1], { push: false });
  else newChat({ push: false });
}

function showSignIn(message = "") {
  stopLive();
  state.api = null;
  localStorage.removeItem(TOKEN_KEY);
  $("#app").hidden = true;
  $("#signin").hidden = false;
  $("#signin-error").textContent = message;
  $("#credential").focus();
}

/** Every call goes through here: an expired credential sends the user back to sign in. */
async function guarded(work) {
  try {
    return await work();
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) showSignIn("Your credential has expired. Sign in again.");
    throw error;
  }
}

// -- the sidebar ----------------------------------------------------------------------------------------------

async function loadChats(more = false) {
  const page = await guarded(() => state.api.chats(more ? state.nextCursor : null, PAGE));
  state.chats = more ? [...state.chats, ...page.data.filter((c) => !state.chats.some((k) => k.id === c.id))] : page.data;
  state.nextCursor = page.next_cursor;
  renderChats();
}

function renderChats() {
  const list = $("#chat-list");
  list.replaceChildren(...state.chats.map(chatItem));
  $("#more-chats").hidden = !state.nextCursor;
  $("#no-chats").hidden = state.chats.length > 0;
}

function chatItem(chat) {
  const current = chat.id === state.chatId;
  const link = h(
    "a",
    { class: "chat-link", href: `/c/${chat.id}`, "aria-current": current ? "page" : null, onclick: (event) => {
      event.preventDefault();
      closeSidebar();
      openChat(chat.id);
    } },
    chat.title,
  );
  const rename = h("button", { class: "icon", type: "button", title: "Rename", "aria-label": `Rename “${chat.title}”`,
    onclick: () => startRename(item, chat) }, icon("pencil"));
  const remove = h("button", { class: "icon", type: "button", title: "Delete", "aria-label": `Delete “${chat.title}”`,
    onclick: () => confirmDelete(chat) }, icon("trash"));
  const item = h("li", { class: current ? "chat current" : "chat", "data-chat-id": chat.id }, link, rename, remove);
  return item;
}

function startRename(item, chat) {
  const input = h("input", { class: "rename", value: chat.title, "aria-label": "Chat title", maxlength: "200" });
  let done = false;
  const finish = async (save) => {
    if (done) return;
    done = true;
    const title = input.value.trim();
    if (save && title && title !== chat.title) {
      try {
        await guarded(() => state.api.rename(chat.id, title));
        chat.title = title;
        if (chat.id === state.chatId) {
          $("#chat-title").textContent = title;
          document.title = `${title} · Parley`;
        }
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
    if (chat.id === state.chatId) newChat();
    else renderChats();
  };
  dialog.showModal();
}

function bumpChat(chatId) {
  const at = state.chats.findIndex((c) => c.id === chatId);
  if (at > 0) state.chats.unshift(...state.chats.splice(at, 1));
  renderChats();
}

// -- opening a chat ---------------------------------------------------------------------------------------

function stopLive() {
  if (state.live) state.live.controller.abort(); // stops reading only: the run goes on and can be resumed
  state.live = null;
  setStreaming(false);
}

function newChat({ push = true } = {}) {
  stopLive();
  state.opening += 1;
  state.chatId = null;
  state.messages = [];
  if (push) history.pushState(null, "", "/");
  $("#chat-title").textContent = "New chat";
  document.title = "Parley";
  renderConversation();
  renderChats();
  $("#composer-input").focus();
}

async function openChat(chatId, { push = true } = {}) {
  stopLive();
  const opening = ++state.opening;
  state.chatId = chatId;
  if (push) history.pushState(null, "", `/c/${chatId}`);
  renderChats();
  $("#messages").replaceChildren(h("p", { class: "loading" }, "Loading…"));
  let chat;
  let messages;
  try {
    [chat, messages] = await guarded(() => Promise.all([state.api.chat(chatId), state.api.messages(chatId)]));
  } catch (error) {
    if (opening !== state.opening) return;
    if (error.status === 404) {
      showBanner("That chat does not exist (it may have been deleted).");
      newChat();
    } else showBanner(`Could not open the chat: ${error.message}`);
    return;
  }
  if (opening !== state.opening) return;
  state.messages = messages;
  $("#chat-title").textContent = chat.title;
  document.title = `${chat.title} · Parley`;
  renderConversation();
  const running = chat.active_run_id;
  if (running && !messages.some((m) => m.id === running)) {
    // An answer still being written (this page was reloaded, or it is open elsewhere): read it from its start.
    stream(chatId, null, { runId: running });
  }
  $("#composer-input").focus();
}

// -- the conversation ----------------------------------------------------------------------------------------

function renderConversation() {
  const list = $("#messages");
  if (!state.messages.length && !state.live) {
    list.replaceChildren(
      h("div", { class: "empty" }, h("h2", {}, "What can I help with?"), h("p", {}, "Answers stream as they are written; stop them any time.")),
    );
    return;
  }
  const lastAnswer = state.live ? null : [...state.messages].reverse().find((m) => m.role === "assistant");
  const items = state.messages.map((m) => (m.role === "user" ? userElement(m.content) : answerElement(fromMessage(m), m, m === lastAnswer)));
  if (state.live) items.push(state.live.el);
  list.replaceChildren(...items);
  scrollToEnd(true);
}

function userElement(text) {
  return h("article", { class: "msg user", "aria-label": "You said" }, h("div", { class: "body" }, text));
}

function modelLine(run) {
  if (!run.model) return null;
  const pool = run.pool ? ` · ${run.pool} pool` : "";
  const degraded = run.degradedFrom ? ` (the ${run.degradedFrom} pool was busy)` : "";
  return h("span", { class: "model", title: "The model that answered" }, `${run.model}${pool}${degraded}`);
}

function notice(run) {
  if (run.status === "refused") {
    const category = run.moderation?.category ? ` (${run.moderation.category.replaceAll("_", " ")})` : "";
    return h("p", { class: "notice refused", role: "note" }, `Not answered: this request goes against the content policy${category}. `,
      run.moderation?.message ? h("span", { class: "detail" }, run.moderation.message) : null);
  }
  if (run.moderation?.action === "retract") {
    const category = run.moderation.category ? ` (${run.moderation.category.replaceAll("_", " ")})` : "";
    return h("p", { class: "notice retracted", role: "note" }, `Part of this answer was withdrawn by moderation${category}.`);
  }
  if (run.status === "error") {
    return h("p", { class: "notice error", role: "note" }, run.error?.message || "The answer failed.");
  }
  if (run.status === "stopped") return h("p", { class: "notice stopped" }, "Stopped.");
  if (run.finishReason === "length") return h("p", { class: "notice stopped" }, "Cut off at the length limit.");
  return null;
}

/** An answer: its text as markdown, what ended it, the model, and (once it ended) its actions. */
function answerElement(run, message = null, last = false) {
  const el = h("article", { class: "msg assistant", "data-run-id": run.runId || "" });
  drawAnswer(el, run, message, last);
  return el;
}

function drawAnswer(el, run, message = null, last = false) {
  el.dataset.runId = run.runId || "";
  el.dataset.status = run.status;
  el.rawText = run.text; // the answer as received (markdown), for copy and for the browser tests
  el.setAttribute("aria-busy", String(!isFinished(run)));
  const body = h("div", { class: "body markdown" });
  if (run.text) body.innerHTML = DOMPurify.sanitize(toHtml(run.text));
  else if (!isFinished(run)) body.append(h("span", { class: "thinking", "aria-label": "Parley is writing" }, h("i"), h("i"), h("i")));
  for (const pre of body.querySelectorAll("pre")) pre.prepend(copyButton(() => pre.querySelector("code")?.textContent ?? "", "Copy code"));
  const footer = h("footer", { class: "meta" }, modelLine(run));
  if (run.status === "queued" && run.estimatedWaitMs > 1000) {
    footer.append(h("span", { class: "queued" }, `In the queue: about ${Math.ceil(run.estimatedWaitMs / 1000)} s`));
  }
  if (isFinished(run) && message) footer.append(...answerActions(run, message, last));
  el.replaceChildren(body, notice(run) || "", footer);
}

function answerActions(run, message, last) {
  const actions = [];
  if (run.text) actions.push(copyButton(() => run.text, "Copy answer"));
  if (run.status !== "error" && run.status !== "refused") {
    for (const [rating, label] of [["up", "Good answer"], ["down", "Bad answer"]]) {
      actions.push(h("button", { class: "icon rate", type: "button", "data-rating": rating, "aria-label": label, title: label,
        "aria-pressed": String(message.feedback === rating), onclick: (event) => rate(message, rating, event.currentTarget) }, icon(rating)));
    }
  }
  if (state.me?.admin && message.run_id) { // admins open the run's history: every stage's event and what was stored
    actions.push(h("a", { class: "text inspect", href: `/runs/${encodeURIComponent(message.run_id)}#token=${encodeURIComponent(state.api.token)}`,
      target: "_blank", rel: "noopener" }, "Inspect"));
  }
  if (last && state.chatId) {
    actions.push(h("button", { class: "text regenerate", type: "button", onclick: () => regenerate(message) }, icon("regenerate"), "Regenerate"));
  }
  return actions;
}

function copyButton(text, label) {
  return h("button", { class: "icon copy", type: "button", "aria-label": label, title: label, onclick: async (event) => {
    const button = event.currentTarget;
    await copy(text());
    button.classList.add("copied");
    announce("Copied.");
    setTimeout(() => button.classList.remove("copied"), 1200);
  } }, icon("copy"));
}

async function copy(text) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const area = h("textarea", { class: "sr-only" }, text); // a page without clipboard permission
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
}

async function rate(message, rating, button) {
  const value = message.feedback === rating ? null : rating; // pressing it again takes the rating back
  const chatId = state.chatId;
  for (let attempt = 0; ; attempt++) {
    try {
      await guarded(() => state.api.feedback(chatId, message.id, value));
      break;
    } catch (error) {
      if (error.status === 404 && attempt < 10) { // the answer is being stored right now
        await new Promise((resolve) => setTimeout(resolve, 300));
        continue;
      }
      showBanner(`Could not record your feedback: ${error.message}`);
      return;
    }
  }
  message.feedback = value;
  for (const other of button.parentElement.querySelectorAll(".rate")) {
    other.setAttribute("aria-pressed", String(other.dataset.rating === value));
  }
  announce(value ? "Thanks for the feedback." : "Feedback removed.");
}

// -- streaming ------------------------------------------------------------------------------------------------

/**
 * Stream an answer into the open chat: open(signal) gives the SSE response of a new message or a regenerate;
 * without it (open = null), the run `runId` is read from its start. Resolves once the answer ended, the user
 * switched chats, or the request was refused (then onRefused(error) says why, before any answer was drawn).
 */
async function stream(chatId, open, { runId = null, onRefused = null } = {}) {
  const controller = new AbortController();
  const start = newRun(runId);
  const live = { chatId, run: start, controller, el: answerElement(start), announcer: new Announcer() };
  state.live = live;
  $("#messages").querySelector(".empty")?.remove();
  $("#messages").append(live.el);
  setStreaming(true);
  scrollToEnd(true);
  for (const button of $("#messages").querySelectorAll(".regenerate")) button.remove(); // only the newest answer
  let response = null;
  if (open) {
    try {
      response = await guarded(() => open(controller.signal));
    } catch (error) {
      live.el.remove();
      if (state.live === live) {
        state.live = null;
        setStreaming(false);
      }
      if (!controller.signal.aborted) (onRefused || refusedBanner)(error);
      return null;
    }
  }
  const run = await follow({
    api: { events: (...args) => guarded(() => state.api.events(...args)) },
    chatId,
    run: live.run,
    first: response,
    signal: controller.signal,
    onUpdate: (next) => {
      live.run = next;
      if (state.live !== live) return;
      const nearEnd = isNearEnd();
      drawAnswer(live.el, next);
      speak(live, next);
      scrollToEnd(nearEnd);
    },
    onConnection: (connection) => state.live === live && showConnection(connection),
  });
  if (state.live !== live) return run; // the user opened another chat meanwhile; it ran on without us
  state.live = null;
  setStreaming(false);
  showConnection("live");
  const message = toMessage(run);
  state.messages.push(message);
  drawAnswer(live.el, run, message, true);
  const left = live.announcer.rest(run.text);
  announce([left, run.status === "stopped" ? "Answer stopped." : run.status === "done" ? "Answer finished." : ""].join(" ").trim());
  bumpChat(chatId);
  return run;
}

function speak(live, run) {
  const words = live.announcer.next(run.text);
  if (words) announce(words);
  if (run.status === "refused" || run.status === "error") announce(notice(run)?.textContent || "");
}

function refusedBanner(error) {
  if (error.status === 429) capacity(error);
  else showBanner(error.message);
}

async function send(text) {
  if (state.live || !text.trim() || $("#send").disabled) return;
  const input = $("#composer-input");
  let chatId = state.chatId;
  if (!chatId) {
    try {
      const chat = await guarded(() => state.api.newChat(titleOf(text)));
      state.chats.unshift(chat);
      chatId = state.chatId = chat.id;
      history.pushState(null, "", `/c/${chat.id}`);
      $("#chat-title").textContent = chat.title;
      document.title = `${chat.title} · Parley`;
      renderChats();
    } catch (error) {
      showBanner(`Could not start a chat: ${error.message}`);
      return;
    }
  }
  input.value = "";
  fitComposer();
  hideBanner();
  const mine = userElement(text);
  $("#messages").querySelector(".empty")?.remove();
  $("#messages").append(mine);
  const local = { id: null, role: "user", content: text };
  state.messages.push(local);
  await stream(chatId, (signal) => state.api.send(chatId, text, signal), {
    onRefused: (error) => {
      mine.remove(); // nothing was answered: the text goes back to the box, to send again
      state.messages = state.messages.filter((m) => m !== local);
      if (!input.value) input.value = text;
      fitComposer();
      refusedBanner(error);
    },
  });
}

async function regenerate(message) {
  if (state.live) return;
  const chatId = state.chatId;
  const old = $("#messages").querySelector(`.msg.assistant[data-run-id="${message.id}"]`);
  const at = state.messages.indexOf(message);
  old?.remove();
  state.messages = state.messages.filter((m) => m !== message);
  await stream(chatId, (signal) => state.api.regenerate(chatId, message.run_id || message.id, signal), {
    onRefused: (error) => {
      state.messages.splice(at, 0, message); // the old answer stays when a new one could not start
      renderConversation();
      refusedBanner(error);
    },
  });
}

async function stop() {
  const live = state.live;
  if (!live || !live.run.runId) return;
  $("#stop").disabled = true;
  $("#stop").textContent = "Stopping…";
  try {
    await guarded(() => state.api.cancel(live.chatId, live.run.runId));
  } catch (error) {
    if (error.code !== "run_already_finished") showBanner(`Could not stop the answer: ${error.message}`);
  }
}

// -- page state: streaming, capacity, connection, banners, announcements ---------------------------------------

function setStreaming(on) {
  $("#send").hidden = on;
  $("#stop").hidden = !on;
  $("#stop").disabled = false;
  $("#stop").textContent = "Stop";
  $("#composer").setAttribute("aria-busy", String(on));
}

function capacity(error) {
  const seconds = Math.max(1, error.retryAfter || 5);
  const until = Date.now() + seconds * 1000;
  clearInterval(state.capacityTimer);
  $("#send").disabled = true;
  const tick = () => {
    const left = Math.ceil((until - Date.now()) / 1000);
    if (left <= 0) {
      clearInterval(state.capacityTimer);
      $("#send").disabled = false;
      hideBanner();
      announce("You can send again.");
      return;
    }
    showBanner(`Parley is at capacity: ${error.message} Try again in ${left} s.`, "capacity", left === seconds);
  };
  tick();
  state.capacityTimer = setInterval(tick, 1000);
}

function showBanner(text, kind = "error", loud = true) {
  const banner = $("#banner");
  banner.hidden = false;
  banner.className = `banner ${kind}`;
  banner.querySelector(".text").textContent = text;
  if (loud) announce(text);
}

function hideBanner() {
  if ($("#banner").classList.contains("capacity") && $("#send").disabled) return;
  $("#banner").hidden = true;
}

function showConnection(connection) {
  const pill = $("#connection");
  const was = pill.hidden ? "live" : pill.dataset.state;
  if (connection === "reconnecting" || connection === "offline") {
    pill.textContent =
      connection === "offline" || !navigator.onLine
        ? "You are offline: the answer goes on when the network is back…"
        : "Connection lost: reconnecting…";
    pill.dataset.state = connection;
    pill.hidden = false;
    if (was !== connection) announce(pill.textContent);
  } else if (!pill.hidden) {
    pill.hidden = true;
    announce("Connected again.");
  }
}

function announce(text) {
  if (!text) return;
  const region = $("#announcer");
  region.append(h("p", {}, text));
  while (region.childElementCount > 8) region.firstElementChild.remove();
}

function isNearEnd() {
  const list = $("#messages");
  return list.scrollHeight - list.scrollTop - list.clientHeight < 80;
}

function scrollToEnd(yes) {
  if (yes) $("#messages").scrollTop = $("#messages").scrollHeight;
}

function titleOf(text) {
  const line = text.trim().split("\n")[0];
  return line.length > 60 ? `${line.slice(0, 57).trimEnd()}…` : line;
}

function fitComposer() {
  const input = $("#composer-input");
  input.style.height = "auto";
  input.style.height = `${Math.min(input.scrollHeight, 240)}px`;
}

// -- theme, layout, keys ---------------------------------------------------------------------------------------

function applyTheme(theme) {
  document.documentElement.dataset.theme = theme;
  const dark = theme === "dark";
  $("#theme").setAttribute("aria-pressed", String(dark));
  $("#theme").replaceChildren(icon(dark ? "sun" : "moon"), dark ? "Light" : "Dark");
}

function toggleTheme() {
  const next = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
  localStorage.setItem(THEME_KEY, next);
  applyTheme(next);
}

function openSidebar() {
  document.body.classList.add("sidebar-open");
  $("#menu").setAttribute("aria-expanded", "true");
  $("#scrim").hidden = false;
  $("#new-chat").focus();
}

function closeSidebar() {
  if (!document.body.classList.contains("sidebar-open")) return;
  document.body.classList.remove("sidebar-open");
  $("#menu").setAttribute("aria-expanded", "false");
  $("#scrim").hidden = true;
}

function wire() {
  drawIcons();
  const stored = localStorage.getItem(THEME_KEY);
  applyTheme(stored || (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light"));
  $("#theme").addEventListener("click", toggleTheme);
  $("#signin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("#credential").value.trim();
    if (token) signIn(token);
  });
  $("#signout").addEventListener("click", () => showSignIn("Signed out."));
  $("#new-chat").addEventListener("click", () => {
    closeSidebar();
    newChat();
  });
  $("#more-chats").addEventListener("click", () => loadChats(true));
  $("#menu").addEventListener("click", () => (document.body.classList.contains("sidebar-open") ? closeSidebar() : openSidebar()));
  $("#scrim").addEventListener("click", closeSidebar);
  $("#banner .close").addEventListener("click", () => ($("#banner").hidden = true));
  const input = $("#composer-input");
  $("#composer").addEventListener("submit", (event) => {
    event.preventDefault();
    send(input.value);
  });
  input.addEventListener("input", fitComposer);
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send(input.value);
    }
  });
  $("#stop").addEventListener("click", stop);
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && state.live && !document.querySelector("dialog[open]")) {
      if (document.activeElement?.classList.contains("rename")) return;
      event.preventDefault();
      stop();
    } else if (event.key === "Escape") closeSidebar();
    if ((event.ctrlKey || event.metaKey) && event.shiftKey && event.key.toLowerCase() === "o") {
      event.preventDefault();
      newChat();
    }
  });
  window.addEventListener("popstate", () => {
    const match = /^\/c\/([0-9a-f-]{36})$/.exec(window.location.pathname);
    if (!state.api) return;
    if (match) openChat(match[1], { push: false });
    else newChat({ push: false });
  });
  window.addEventListener("offline", () => showConnection("offline"));
  window.addEventListener("online", () => $("#connection").dataset.state === "offline" && showConnection("live"));
}

wire();
const token = tokenFromUrl() || localStorage.getItem(TOKEN_KEY);
if (token) signIn(token, { quiet: true });
else showSignIn();
