// The composer: sending a message, regenerating the latest answer, stopping, and streaming the answer in.
import { Announcer } from "./announce.js";
import {
  answerElement,
  drawAnswer,
  notice,
  renderConversation,
  userElement,
} from "./conversation.js";
import { follow } from "./follow.js";
import {
  announce,
  fitComposer,
  guarded,
  hideBanner,
  isNearEnd,
  refusedBanner,
  scrollToEnd,
  setStreaming,
  showBanner,
  showConnection,
  titleOf,
} from "./page.js";
import { newRun, toMessage } from "./run.js";
import { applyPendingModel, showChatSettings } from "./settings.js";
import { bumpChat, renderChats } from "./sidebar.js";
import { chosen } from "./tools.js";
import { $, actions, h, showTitle, state } from "./state.js";

/**
 * Stream an answer into the open chat: open(signal) gives the SSE response of a new message or a regenerate;
 * without it (open = null), the run `runId` is read from its start. Resolves once the answer ended, the user
 * switched chats, or the request was refused (then onRefused(error) says why, before any answer was drawn).
 */
export async function stream(
  chatId,
  open,
  { runId = null, onRefused = null, onRedacted = null } = {},
) {
  const controller = new AbortController();
  const start = newRun(runId);
  const live = {
    chatId,
    run: start,
    controller,
    el: answerElement(start),
    announcer: new Announcer(),
  };
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
      if (next.redacted && !live.run.redacted) onRedacted?.(next.redacted);
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
  const ended = { stopped: "Answer stopped.", done: "Answer finished." }[run.status] ?? "";
  announce([live.announcer.rest(run.text), ended].join(" ").trim());
  bumpChat(chatId);
  actions.answered();
  return run;
}

/** Screen readers hear the answer sentence by sentence, and a refusal or error when it comes. */
function speak(live, run) {
  const words = live.announcer.next(run.text);
  if (words) announce(words);
  if (run.status === "refused" || run.status === "error") announce(notice(run)?.textContent || "");
}

/** Send a message at the end of the open branch, or (an edit sent again) after `parent`: then its answer's
 * branch is read back once stored, so the versions show. */
export async function send(text, { parent = undefined } = {}) {
  if (state.live || !text.trim() || $("#send").disabled) return;
  const input = $("#composer-input");
  const chatId = await ensureChat(titleOf(text));
  if (!chatId) return;
  input.value = "";
  fitComposer();
  hideBanner();
  const after = parent === undefined ? (state.messages.at(-1)?.id ?? null) : parent;
  const local = { id: null, role: "user", content: text, parent_id: after, sibling_ids: [] };
  const mine = userElement(text, local);
  $("#messages").querySelector(".empty")?.remove();
  $("#messages").append(mine);
  state.messages.push(local);
  const run = await stream(
    chatId,
    (signal) => state.api.send(chatId, text, signal, parent, [...chosen]),
    {
      onRedacted: (kept) => redacted(mine, local, kept),
      onRefused: (error) => {
        mine.remove(); // nothing was answered: the text goes back to the box, to send again
        state.messages = state.messages.filter((m) => m !== local);
        if (!input.value) input.value = text;
        fitComposer();
        refusedBanner(error);
      },
    },
  );
  if (parent !== undefined && run?.runId) await readBranch(chatId, run.runId);
}

const TAKEN_OUT = {
  card: "card number",
  secret: "key or password",
  email: "email address",
  phone: "phone number",
};

/** The person's message as it was kept, with what was taken out before it reached the model. */
function redacted(el, message, { content, kinds }) {
  message.content = content;
  el.querySelector(".body").textContent = content;
  const what = kinds.map((k) => TAKEN_OUT[k] || k).join(", ");
  el.append(
    h("p", { class: "redacted-note", role: "status" }, `Taken out before sending: ${what}.`),
  );
}

/** The open chat's id; a new chat (titled `title`) is made first when none is open. Null when it could not be. */
export async function ensureChat(title) {
  if (state.chatId) return state.chatId;
  try {
    const chat = await guarded(() => state.api.newChat(title));
    await applyPendingModel(chat.id);
    state.chats.unshift(chat);
    state.chatId = chat.id;
    history.pushState(null, "", `/c/${chat.id}`);
    showTitle(chat.title);
    showChatSettings({ ...chat, model: $("#model-picker").value, instructions: "" });
    renderChats();
    return chat.id;
  } catch (error) {
    showBanner(`Could not start a chat: ${error.message}`);
    return null;
  }
}

/** An earlier message edited and sent again: the branch up to it stays, the new one grows from there. */
export async function resubmit(message, text) {
  if (state.live) return;
  const at = state.messages.indexOf(message);
  const parent = message.parent_id ?? (at > 0 ? state.messages[at - 1].id : null);
  state.messages = state.messages.slice(0, Math.max(0, at));
  renderConversation();
  await send(text, { parent });
}

/** Answer again: the new answer streams in the old one's place; the old one stays as its other version. */
export async function regenerate(message) {
  if (state.live) return;
  const chatId = state.chatId;
  const at = state.messages.indexOf(message);
  $("#messages").querySelector(`.msg.assistant[data-run-id="${message.id}"]`)?.remove();
  state.messages = state.messages.filter((m) => m !== message);
  const run = await stream(
    chatId,
    (signal) => state.api.regenerate(chatId, message.run_id || message.id, signal),
    {
      onRefused: (error) => {
        state.messages.splice(at, 0, message); // the old answer shows again when a new one could not start
        renderConversation();
        refusedBanner(error);
      },
    },
  );
  if (run?.runId) await readBranch(chatId, run.runId);
}

/** The open chat's branch read back once the answer `runId` is stored (its versions then show). */
async function readBranch(chatId, runId) {
  for (let attempt = 0; attempt < 20; attempt++) {
    if (state.chatId !== chatId || state.live) return;
    let messages;
    try {
      messages = await guarded(() => state.api.messages(chatId));
    } catch {
      return;
    }
    if (messages.some((m) => m.id === runId)) {
      if (state.chatId !== chatId || state.live) return;
      state.messages = messages;
      renderConversation();
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

/** Another version of a message: the branch through it becomes the chat's current one. */
export async function showBranch(messageId) {
  if (state.live) return;
  const chatId = state.chatId;
  try {
    await guarded(() => state.api.chooseBranch(chatId, messageId));
    const messages = await guarded(() => state.api.messages(chatId));
    if (state.chatId !== chatId) return;
    state.messages = messages;
    renderConversation();
    announce("Showing another version.");
  } catch (error) {
    showBanner(`Could not open that version: ${error.message}`);
  }
}

export async function stop() {
  const live = state.live;
  if (!live || !live.run.runId) return;
  $("#stop").disabled = true;
  $("#stop").textContent = "Stopping…";
  try {
    await guarded(() => state.api.cancel(live.chatId, live.run.runId));
  } catch (error) {
    if (error.code !== "run_already_finished")
      showBanner(`Could not stop the answer: ${error.message}`);
  }
}
