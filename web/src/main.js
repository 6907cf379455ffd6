// The chat app: signs in, then wires the views (sidebar, conversation, composer, page) to the page's controls.
// Plain DOM, no framework; the shared state is state.js, and each view draws its own part of the page.
import { Api } from "./api.js";
import { regenerate, resubmit, send, showBranch, stop, stream } from "./composer.js";
import { newChat, openChat } from "./conversation.js";
import { showDocuments, wireDocuments } from "./documents.js";
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
import { openSearch, wireSearch } from "./search.js";
import { checkBudget, loadModels, wireSettings } from "./settings.js";
import { loadTools, wireTools } from "./tools.js";
import { loadChats, wireArchive } from "./sidebar.js";
import { $, actions, chatOfPath, state, THEME_KEY } from "./state.js";

Object.assign(actions, {
  openChat,
  newChat,
  stream,
  regenerate,
  resubmit,
  showBranch,
  showDocuments,
  answered: checkBudget,
});

function tokenFromUrl() {
  const match = /(?:^#|&)token=([^&]+)/.exec(window.location.hash);
  if (!match) return null;
  history.replaceState(null, "", window.location.pathname + window.location.search); // not left in the address bar
  return decodeURIComponent(match[1]);
}

/** Open the app on this browser's session, if it has one; the sign-in screen otherwise. */
async function signIn(message = "") {
  const api = new Api();
  try {
    state.me = await api.me();
  } catch (error) {
    showSignIn(error.status === 401 ? message : error.message);
    return;
  }
  api.csrf = state.me.csrf_token;
  state.api = api;
  $("#signin").hidden = true;
  $("#app").hidden = false;
  $("#who").textContent = `${state.me.name || state.me.user_id} · ${state.me.tier}`;
  $("#admin-link").hidden = state.me.role === "member";
  loadTools(); // the picker's options: nothing else waits for them
  await Promise.all([loadChats(), loadModels()]);
  showPath({ push: false });
  checkBudget();
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
  if ((event.ctrlKey || event.metaKey) && !event.shiftKey && event.key.toLowerCase() === "k") {
    event.preventDefault(); // the browser's own Ctrl+K goes to its address bar
    if (state.api) openSearch();
  }
}

function wire() {
  drawIcons();
  wireSettings();
  wireSearch();
  wireDocuments();
  wireTools();
  const stored = localStorage.getItem(THEME_KEY);
  applyTheme(stored || (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light"));
  $("#theme").addEventListener("click", toggleTheme);
  $("#signin-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = $("#credential").value.trim();
    if (token) await withToken(token);
  });
  $("#local-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const owner = Boolean($("#local-form").dataset.owner);
    try {
      await new Api().localSignIn($("#username").value.trim(), $("#password").value, owner);
    } catch (error) {
      showSignIn(error.message);
      return;
    }
    $("#password").value = "";
    await signIn();
  });
  $("#signout").addEventListener("click", signOut);
  $("#new-chat").addEventListener("click", () => {
    closeSidebar();
    newChat();
  });
  $("#more-chats").addEventListener("click", () => loadChats(true));
  wireArchive();
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

async function withToken(token) {
  try {
    await new Api().tokenSignIn(token);
  } catch (error) {
    showSignIn(error.status === 401 ? "That token was not accepted." : error.message);
    return;
  }
  await signIn();
}

async function signOut() {
  let page = null;
  try {
    page = (await state.api.signOut()).provider_logout;
  } catch {
    page = null; // the session is gone or going: the sign-in screen either way
  }
  if (page) window.location.assign(page);
  else showSignIn("Signed out.");
}

async function start() {
  wire();
  try {
    const methods = await new Api().methods();
    $("#signin-provider").hidden = !methods.oidc;
    $("#signin-form").hidden = !methods.dev_tokens;
    $("#local-form").hidden = !methods.local;
    $("#local-owner").hidden = !methods.needs_owner;
    $("#local-form").dataset.owner = methods.needs_owner ? "1" : "";
    $("#local-submit").textContent = methods.needs_owner ? "Create the owner account" : "Sign in";
  } catch {
    $("#signin-form").hidden = false;
  }
  const token = tokenFromUrl();
  if (token) await withToken(token);
  else await signIn();
}

start();
