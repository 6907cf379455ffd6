// The conversation: opening a chat, its messages, and each answer with what ended it and its actions.
import DOMPurify from "dompurify";
import { icon } from "./icons.js";
import { toHtml } from "./markdown.js";
import { announce, guarded, scrollToEnd, showBanner, stopLive } from "./page.js";
import { sourcesList, toolsList } from "./provenance.js";
import { fromMessage, isFinished } from "./run.js";
import { showChatSettings } from "./settings.js";
import { renderChats } from "./sidebar.js";
import { $, actions, categoryLabel, h, showTitle, state } from "./state.js";

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

// -- opening a chat -------------------------------------------------------------------------------------------

export function newChat({ push = true } = {}) {
  stopLive();
  state.opening += 1;
  state.chatId = null;
  state.messages = [];
  if (push) history.pushState(null, "", "/");
  showTitle(null);
  showChatSettings(null);
  actions.showDocuments(null);
  renderConversation();
  renderChats();
  $("#composer-input").focus();
}

/** Open a chat; `at`: a message to show (a search hit), its branch made current when it is on another. */
export async function openChat(chatId, { push = true, at = null } = {}) {
  stopLive();
  const opening = ++state.opening;
  state.chatId = chatId;
  if (push) history.pushState(null, "", `/c/${chatId}`);
  renderChats();
  $("#messages").replaceChildren(h("p", { class: "loading" }, "Loading…"));
  let chat;
  let messages;
  try {
    [chat, messages] = await guarded(() =>
      Promise.all([state.api.chat(chatId), state.api.messages(chatId)]),
    );
    if (at && !messages.some((m) => m.id === at)) {
      await guarded(() => state.api.chooseBranch(chatId, at));
      messages = await guarded(() => state.api.messages(chatId));
    }
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
  showTitle(chat.title);
  showChatSettings(chat);
  actions.showDocuments(chatId);
  renderConversation();
  const running = chat.active_run_id;
  if (running && !messages.some((m) => m.id === running)) {
    // An answer still being written (this page was reloaded, or it is open elsewhere): read it from its start.
    actions.stream(chatId, null, { runId: running });
  }
  if (at) showMessage(at);
  else $("#composer-input").focus();
}

/** Bring a message into view, marked, and move the focus to it. */
function showMessage(messageId) {
  const el = document.querySelector(`#messages [data-message-id="${CSS.escape(messageId)}"]`);
  if (!el) return;
  el.classList.add("found");
  el.setAttribute("tabindex", "-1");
  el.scrollIntoView({ block: "center" });
  el.focus();
}

// -- the messages ---------------------------------------------------------------------------------------------

export function renderConversation() {
  const list = $("#messages");
  if (!state.messages.length && !state.live) {
    const hint = "Answers stream as they are written; stop them any time.";
    list.replaceChildren(
      h("div", { class: "empty" }, h("h2", {}, "What can I help with?"), h("p", {}, hint)),
    );
    return;
  }
  const lastAnswer = state.live ? null : state.messages.findLast((m) => m.role === "assistant");
  const items = state.messages.map((m) =>
    m.role === "user"
      ? userElement(m.content, m)
      : answerElement(fromMessage(m), m, m === lastAnswer),
  );
  if (state.live) items.push(state.live.el);
  list.replaceChildren(...items);
  scrollToEnd(true);
}

/** A message of the person's: its text, its other versions ("‹ 2/3 ›") and Edit (sent again as a new branch). */
export function userElement(text, message = null) {
  const el = h(
    "article",
    { class: "msg user", "aria-label": "You said", "data-message-id": message?.id || "" },
    h("div", { class: "body" }, text),
  );
  if (message && state.chatId) {
    const edit = h(
      "button",
      { class: "text edit", type: "button", onclick: () => editor(el, message) },
      "Edit",
    );
    el.append(h("footer", { class: "meta" }, versions(message), edit));
  }
  return el;
}

/** Edit a message in place; sending it makes a new branch beside the old one, which stays. */
function editor(el, message) {
  if (state.live) return;
  const id = `edit-${message.id || "new"}`;
  const area = h("textarea", { id, rows: 3, class: "edit-input" });
  area.value = message.content;
  const cancel = () => renderConversation();
  const submit = (event) => {
    event.preventDefault();
    if (area.value.trim()) actions.resubmit(message, area.value);
  };
  const form = h(
    "form",
    { class: "edit-form", onsubmit: submit },
    h("label", { for: id, class: "sr-only" }, "Edit your message"),
    area,
    h(
      "div",
      { class: "dialog-actions" },
      h("button", { type: "button", class: "text", onclick: cancel }, "Cancel"),
      h("button", { type: "submit", class: "primary" }, "Send"),
    ),
  );
  el.replaceChildren(form);
  area.focus();
}

/** "‹ 2/3 ›": the other versions of a message (an edited question, a regenerated answer); each opens its branch. */
export function versions(message) {
  const ids = message.sibling_ids || [];
  const at = ids.indexOf(message.id);
  if (ids.length < 2 || at < 0) return null;
  const step = (to, label, text) =>
    h(
      "button",
      {
        class: "icon",
        type: "button",
        "aria-label": label,
        disabled: to < 0 || to >= ids.length,
        onclick: () => actions.showBranch(ids[to]),
      },
      text,
    );
  return h(
    "nav",
    { class: "versions", "aria-label": `Version ${at + 1} of ${ids.length}` },
    step(at - 1, "Previous version", "‹"),
    h("span", { class: "count" }, `${at + 1}/${ids.length}`),
    step(at + 1, "Next version", "›"),
  );
}

function modelLine(run) {
  if (!run.model) return null;
  const pool = run.pool ? ` · ${run.pool} pool` : "";
  const degraded = run.degradedFrom ? ` (the ${run.degradedFrom} pool was busy)` : "";
  return h(
    "span",
    { class: "model", title: "The model that answered" },
    `${run.model}${pool}${degraded}`,
  );
}

/** The person's memories the answer's context recalled, named under it. */
function memoriesLine(run) {
  if (!run.memories?.length) return null;
  return h(
    "p",
    { class: "memories", title: "Recalled from your memories (Account → Memories)" },
    `From your memories: ${run.memories.join(" · ")}`,
  );
}

/** What ended an answer other than its own end: a refusal, a retraction, an error, a stop, the length limit. */
export function notice(run) {
  const note = (kind, ...text) => h("p", { class: `notice ${kind}`, role: "note" }, ...text);
  const category = categoryLabel(run.moderation?.category);
  if (run.status === "refused") {
    const detail = run.moderation?.message
      ? h("span", { class: "detail" }, run.moderation.message)
      : null;
    return note(
      "refused",
      `Not answered: this request goes against the content policy${category}. `,
      detail,
    );
  }
  if (run.moderation?.action === "retract") {
    return note("retracted", `Part of this answer was withdrawn by moderation${category}.`);
  }
  if (run.status === "error") return note("error", run.error?.message || "The answer failed.");
  if (run.status === "stopped") return h("p", { class: "notice stopped" }, "Stopped.");
  if (run.finishReason === "length")
    return h("p", { class: "notice stopped" }, "Cut off at the length limit.");
  return null;
}

/** An answer: its text as markdown, what ended it, the model, and (once it ended) its actions. */
export function answerElement(run, message = null, last = false) {
  const el = h("article", {
    class: "msg assistant",
    "data-run-id": run.runId || "",
    "data-message-id": message?.id || "",
  });
  drawAnswer(el, run, message, last);
  return el;
}

export function drawAnswer(el, run, message = null, last = false) {
  el.dataset.runId = run.runId || "";
  el.dataset.status = run.status;
  el.rawText = run.text; // the answer as received (markdown), for copy and for the browser tests
  el.setAttribute("aria-busy", String(!isFinished(run)));
  const body = h("div", { class: "body markdown" });
  if (run.text) body.innerHTML = DOMPurify.sanitize(toHtml(run.text));
  else if (!isFinished(run)) {
    body.append(
      h("span", { class: "thinking", "aria-label": "Parley is writing" }, h("i"), h("i"), h("i")),
    );
  }
  for (const pre of body.querySelectorAll("pre")) {
    pre.prepend(copyButton(() => pre.querySelector("code")?.textContent ?? "", "Copy code"));
  }
  const footer = h("footer", { class: "meta" }, message ? versions(message) : null, modelLine(run));
  if (run.status === "queued" && run.estimatedWaitMs > 1000) {
    const wait = `In the queue: about ${Math.ceil(run.estimatedWaitMs / 1000)} s`;
    footer.append(h("span", { class: "queued" }, wait));
  }
  if (isFinished(run) && message) footer.append(...answerActions(run, message, last));
  el.replaceChildren(
    body,
    notice(run) || "",
    memoriesLine(run) || "",
    toolsList(run) || "",
    sourcesList(run) || "",
    footer,
  );
}

function answerActions(run, message, last) {
  const actionsOf = [];
  if (run.text) actionsOf.push(copyButton(() => run.text, "Copy answer"));
  if (run.status !== "error" && run.status !== "refused") {
    for (const [rating, label] of [
      ["up", "Good answer"],
      ["down", "Bad answer"],
    ]) {
      const attrs = {
        class: "icon rate",
        type: "button",
        "data-rating": rating,
        "aria-label": label,
        title: label,
      };
      const pressed = String(message.feedback === rating);
      const onclick = (event) => rate(message, rating, event.currentTarget);
      actionsOf.push(h("button", { ...attrs, "aria-pressed": pressed, onclick }, icon(rating)));
    }
  }
  if (state.me?.admin && message.run_id) {
    // admins open the run's history: every stage's event and what was stored
    const href = `/runs/${encodeURIComponent(message.run_id)}`;
    actionsOf.push(
      h("a", { class: "text inspect", href, target: "_blank", rel: "noopener" }, "Inspect"),
    );
  }
  if (last && state.chatId) {
    const onclick = () => actions.regenerate(message);
    actionsOf.push(
      h(
        "button",
        { class: "text regenerate", type: "button", onclick },
        icon("regenerate"),
        "Regenerate",
      ),
    );
  }
  return actionsOf;
}

function copyButton(text, label) {
  const onclick = async (event) => {
    const button = event.currentTarget;
    await copy(text());
    button.classList.add("copied");
    announce("Copied.");
    setTimeout(() => button.classList.remove("copied"), 1200);
  };
  return h(
    "button",
    { class: "icon copy", type: "button", "aria-label": label, title: label, onclick },
    icon("copy"),
  );
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
      if (error.status === 404 && attempt < 10) {
        // the answer is being stored right now
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
