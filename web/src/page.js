// The page around the conversation: sign-in state, banners, the connection pill, announcements for screen
// readers, the capacity countdown, the composer's buttons, scrolling, the theme and the sidebar drawer.
import { ApiError } from "./api.js";
import { icon } from "./icons.js";
import { $, EXPIRED, h, state, THEME_KEY } from "./state.js";

// -- sign in --------------------------------------------------------------------------------------------------

export function showSignIn(message = "") {
  stopLive();
  state.api = null;
  $("#app").hidden = true;
  $("#signin").hidden = false;
  $("#signin-error").textContent = message;
  const provider = $("#signin-provider");
  provider.href = `/auth/login?return_to=${encodeURIComponent(window.location.pathname)}`;
  (provider.hidden ? $("#credential") : provider).focus();
}

/** Every call goes through here: an expired credential sends the user back to sign in. */
export async function guarded(work) {
  try {
    return await work();
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) showSignIn(EXPIRED);
    throw error;
  }
}

/** Stop reading the open answer: the run goes on and can be resumed. */
export function stopLive() {
  if (state.live) state.live.controller.abort();
  state.live = null;
  setStreaming(false);
}

// -- streaming and capacity -----------------------------------------------------------------------------------

export function setStreaming(on) {
  $("#send").hidden = on;
  $("#stop").hidden = !on;
  $("#stop").disabled = false;
  $("#stop").textContent = "Stop";
  $("#composer").setAttribute("aria-busy", String(on));
}

/** A 429: the send button waits out Retry-After, counting down in the banner. */
export function capacity(error) {
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
    const text = `Parley is at capacity: ${error.message} Try again in ${left} s.`;
    showBanner(text, "capacity", left === seconds);
  };
  tick();
  state.capacityTimer = setInterval(tick, 1000);
}

export function refusedBanner(error) {
  if (error.status === 429) capacity(error);
  else showBanner(error.message);
}

// -- banners, connection, announcements -----------------------------------------------------------------------

export function showBanner(text, kind = "error", loud = true) {
  const banner = $("#banner");
  banner.hidden = false;
  banner.className = `banner ${kind}`;
  banner.querySelector(".text").textContent = text;
  if (loud) announce(text);
}

export function hideBanner() {
  if ($("#banner").classList.contains("capacity") && $("#send").disabled) return;
  $("#banner").hidden = true;
}

export function showConnection(connection) {
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

/** Said by the polite live region (the last 8 lines are kept). */
export function announce(text) {
  if (!text) return;
  const region = $("#announcer");
  region.append(h("p", {}, text));
  while (region.childElementCount > 8) region.firstElementChild.remove();
}

// -- scrolling and the composer -------------------------------------------------------------------------------

export function isNearEnd() {
  const list = $("#messages");
  return list.scrollHeight - list.scrollTop - list.clientHeight < 80;
}

export function scrollToEnd(yes) {
  if (yes) $("#messages").scrollTop = $("#messages").scrollHeight;
}

export function fitComposer() {
  const input = $("#composer-input");
  input.style.height = "auto";
  input.style.height = `${Math.min(input.scrollHeight, 240)}px`;
}

/** A new chat's title: its first message's first line, cut to 60 characters. */
export function titleOf(text) {
  const line = text.trim().split("\n")[0];
  return line.length > 60 ? `${line.slice(0, 57).trimEnd()}…` : line;
}

// -- theme and the sidebar drawer -----------------------------------------------------------------------------

export function applyTheme(theme) {
  document.documentElement.dataset.theme = theme;
  const dark = theme === "dark";
  $("#theme").setAttribute("aria-pressed", String(dark));
  $("#theme").replaceChildren(icon(dark ? "sun" : "moon"), dark ? "Light" : "Dark");
}

export function toggleTheme() {
  const next = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
  localStorage.setItem(THEME_KEY, next);
  applyTheme(next);
}

export function openSidebar() {
  document.body.classList.add("sidebar-open");
  $("#menu").setAttribute("aria-expanded", "true");
  $("#scrim").hidden = false;
  $("#new-chat").focus();
}

export function closeSidebar() {
  if (!document.body.classList.contains("sidebar-open")) return;
  document.body.classList.remove("sidebar-open");
  $("#menu").setAttribute("aria-expanded", "false");
  $("#scrim").hidden = true;
}
