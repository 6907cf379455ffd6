// Search across the person's chats (Ctrl+K, or the sidebar's Search): results as one types, by words (the
// matching words marked) and by meaning; choosing one opens its chat at that message, on its branch.
import { closeSidebar, guarded } from "./page.js";
import { $, actions, h, state } from "./state.js";

const WAIT_MS = 200; // typing pauses this long before a search goes out
let asked = 0; // the newest search; an older answer arriving late is not drawn
let timer = null;

function say(text) {
  $("#search-status").textContent = text;
}

/** The snippet as text nodes, its matching words in <mark> (never parsed as HTML). */
function marked(snippet, highlights) {
  const parts = [];
  let at = 0;
  for (const [start, end] of highlights) {
    if (start < at) continue;
    parts.push(snippet.slice(at, start), h("mark", {}, snippet.slice(start, end)));
    at = end;
  }
  parts.push(snippet.slice(at));
  return parts;
}

function result(hit) {
  const who = hit.role === "user" ? "You" : "Parley";
  const how = hit.match === "meaning" ? " · related" : "";
  return h(
    "li",
    {},
    h(
      "button",
      {
        type: "button",
        class: "search-hit",
        "data-message-id": hit.message_id,
        onclick: () => choose(hit),
      },
      h("span", { class: "search-chat" }, hit.chat_title || "Untitled chat"),
      h("span", { class: "search-snippet" }, `${who}: `, ...marked(hit.snippet, hit.highlights)),
      h("span", { class: "search-how" }, `${new Date(hit.created_at).toLocaleDateString()}${how}`),
    ),
  );
}

async function find(q) {
  const mine = ++asked;
  if (!q.trim()) {
    $("#search-results").replaceChildren();
    say("");
    return;
  }
  say("Searching…");
  try {
    const found = await guarded(() => state.api.search(q));
    if (mine !== asked) return;
    $("#search-results").replaceChildren(...found.data.map(result));
    const n = found.data.length;
    say(n ? `${n} ${n === 1 ? "message" : "messages"} found.` : "Nothing found.");
  } catch (error) {
    if (mine === asked) say(error.message);
  }
}

function choose(hit) {
  $("#search-dialog").close();
  closeSidebar();
  actions.openChat(hit.chat_id, { at: hit.message_id });
}

export function openSearch() {
  const dialog = $("#search-dialog");
  if (dialog.open) return;
  dialog.showModal();
  $("#search-input").select();
}

export function wireSearch() {
  $("#search").addEventListener("click", openSearch);
  $("#search-input").addEventListener("input", (event) => {
    clearTimeout(timer);
    timer = setTimeout(() => find(event.target.value), WAIT_MS);
  });
  $("#search-form").addEventListener("submit", (event) => {
    event.preventDefault();
    clearTimeout(timer);
    find($("#search-input").value);
  });
  $("#search-close").addEventListener("click", () => $("#search-dialog").close());
}
