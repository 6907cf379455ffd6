// The chat app: signs in, then wires the views (sidebar, conversation, composer, page) to the page's controls.
// Plain DOM, no framework; the shared state is state.js, and each view draws its own part of the page.
import { Api } from "./api.js";
import { regenerate, send, stop, stream } from "./composer.js";
import { newChat, openChat } from "./conversation.js";
import { drawIcons } from "./icons.js";
import {
  applyTheme,
  closeSidebar,
  fitComposer,
  openSidebar,
  showConnection,
  showSignIn,
  toggleTheme,
} from "./page.js";
import { loadChats } from "./sidebar.js";
import { $, actions, chatOfPath, EXPIRED, state, THEME_KEY, TOKEN_KEY } from "./state.js";

Object.assign(actions, { openChat, newChat, stream, regenerate });

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
    const refused = quiet ? EXPIRED : "That credential was not accepted.";
    showSignIn(error.status === 401 ? refused : error.message);
    return;
  }
  state.api = api;
  localStorage.setItem(TOKEN_KEY, token);
  $("#signin").hidden = true;
  $("#app").hidden = false;
  $("#who").textContent = `${state.me.user_id} · ${state.me.tier}`;
  await loadChats();
  showPath({ push: false });
}

/** The chat the address names, or a new chat. */
function showPath(options) {
  const chatId = chatOfPath(window.location.pathname);
  if (chatId) openChat(chatId, options);
  else newChat(options);
}

function onKey(event) {
  if (event.key === "Escape" && state.live && !document.querySelector("dialog[open]")) {
    if (document.activeElement?.classList.contains("rename")) return;
    event.preventDefault();
    stop();
  } else if (event.key === "Escape") closeSidebar();
  if ((event.ctrlKey || event.metaKey) && event.shiftKey && event.key.toLowerCase() === "o") {
    event.preventDefault();
    newChat();
  }
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
  const drawerOpen = () => document.body.classList.contains("sidebar-open");
  $("#menu").addEventListener("click", () => (drawerOpen() ? closeSidebar() : openSidebar()));
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
  document.addEventListener("keydown", onKey);
  window.addEventListener("popstate", () => state.api && showPath({ push: false }));
  window.addEventListener("offline", () => showConnection("offline"));
  window.addEventListener(
    "online",
    () => $("#connection").dataset.state === "offline" && showConnection("live"),
  );
}

wire();
const token = tokenFromUrl() || localStorage.getItem(TOKEN_KEY);
if (token) signIn(token, { quiet: true });
else showSignIn();
