// What a person sets and sees of their own: the model picker (remembered per chat), the chat's instructions,
// the account dialog (tier, budget, this month's tokens, their instructions for every chat), and a notice
// before the budget runs out.
import { listMemories, wireMemories } from "./memories.js";
import { guarded, showBanner, showSignIn } from "./page.js";
import { $, h, state } from "./state.js";

export const LOW_BUDGET = 0.1; // the share of the budget left under which the app says so

const number = new Intl.NumberFormat("en");

/** The model picker's options: each model served, with what it is for and how long a chat it holds. */
export async function loadModels() {
  const list = await guarded(() => state.api.models());
  state.models = list.data;
  const options = list.data.map((m) =>
    h("option", { value: m.id, disabled: !m.allowed }, modelLabel(m)),
  );
  $("#model-picker").replaceChildren(...options);
  showChatSettings(state.chatSettings.chat);
}

export function modelLabel(model) {
  const size = `${Math.round(model.context_length / 1024)}k tokens`;
  const about = model.description ? ` · ${model.description}` : "";
  return `${model.id}${about} (${size})${model.allowed ? "" : " · not in your tier"}`;
}

function defaultModel() {
  return state.models.find((m) => m.allowed)?.id ?? "";
}

/** The open chat's model in the picker (a new chat: the one picked for it), and its instructions button. */
export function showChatSettings(chat) {
  state.chatSettings = {
    chat,
    model: chat ? chat.model : state.pendingModel,
    instructions: chat?.instructions || "",
  };
  $("#model-picker").value = state.chatSettings.model || defaultModel();
  $("#chat-settings").hidden = !chat;
  $("#share").hidden = !chat;
}

async function pickModel() {
  const model = $("#model-picker").value;
  if (!state.chatId) {
    state.pendingModel = model; // applied when the chat is made, with its first message
    return;
  }
  try {
    const chat = await guarded(() => state.api.changeChat(state.chatId, { model }));
    state.chatSettings.model = chat.model;
  } catch (error) {
    showBanner(`Could not change the model: ${error.message}`);
    $("#model-picker").value = state.chatSettings.model || defaultModel();
  }
}

/** A chat just made takes the model picked before its first message. */
export async function applyPendingModel(chatId) {
  const model = state.pendingModel;
  state.pendingModel = null;
  if (model) await guarded(() => state.api.changeChat(chatId, { model }));
}

async function saveChatInstructions(event) {
  if (event.submitter?.value !== "save") return;
  event.preventDefault();
  const instructions = $("#chat-instructions").value;
  try {
    const chat = await guarded(() => state.api.changeChat(state.chatId, { instructions }));
    state.chatSettings.instructions = chat.instructions;
    $("#chat-dialog").close();
  } catch (error) {
    $("#chat-status").textContent = error.message;
  }
}

/** The account dialog: usage and budget as they stand now, and the person's own instructions. */
async function openAccount() {
  $("#account-status").textContent = "";
  $("#account-dialog").showModal();
  const [usage, mine] = await Promise.allSettled([
    guarded(() => state.api.usage()),
    guarded(() => state.api.instructions()),
  ]);
  if (mine.status === "fulfilled") $("#my-instructions").value = mine.value.content;
  if (usage.status === "fulfilled") showUsage(usage.value);
  else $("#account-status").textContent = `Usage is unavailable: ${usage.reason.message}`;
  $("#memory-status").textContent = "";
  await Promise.all([listShares(), listMemories()]);
}

/** Delete the person's account, once they confirm: everything of theirs goes and they are signed out. */
function confirmErase() {
  const dialog = $("#confirm-erase");
  dialog.returnValue = "";
  dialog.onclose = async () => {
    if (dialog.returnValue !== "erase") return;
    try {
      await guarded(() => state.api.eraseMe());
    } catch (error) {
      $("#account-status").textContent = `Your account was not deleted: ${error.message}`;
      return;
    }
    $("#account-dialog").close();
    showSignIn("Your account and everything in it were deleted.");
  };
  dialog.showModal();
}

/** The person's shared links, newest first, each with Revoke. */
async function listShares() {
  let shares = [];
  try {
    shares = (await guarded(() => state.api.shares())).data;
  } catch {
    // the list is best effort: none shown when it cannot be read
  }
  const item = (share) =>
    h(
      "li",
      {},
      h("a", { href: share.url, target: "_blank", rel: "noopener" }, share.title),
      h(
        "button",
        {
          type: "button",
          class: "text",
          "aria-label": `Revoke the link to ${share.title}`,
          onclick: async () => {
            await revoke(share.chat_id, share.id, $("#account-status"), "Link revoked.");
            await listShares();
          },
        },
        "Revoke",
      ),
    );
  $("#my-shares").replaceChildren(...shares.map(item));
  $("#no-shares").hidden = shares.length > 0;
}

/** Revoke a share; `status` says how it went (`done`, or the error). True once revoked. */
async function revoke(chatId, shareId, status, done) {
  try {
    await guarded(() => state.api.revokeShare(chatId, shareId));
    status.textContent = done;
    return true;
  } catch (error) {
    status.textContent = error.message;
    return false;
  }
}

/** Share the open chat: a read-only snapshot of its branch, by a link for the deployment's people. */
async function shareChat() {
  $("#share-status").textContent = "";
  $("#share-link").value = "";
  $("#share-dialog").showModal();
  try {
    const share = await guarded(() => state.api.share(state.chatId));
    $("#share-link").value = share.url;
    $("#share-form").dataset.shareId = share.id;
    $("#share-form").dataset.chatId = share.chat_id;
  } catch (error) {
    $("#share-status").textContent = `Could not share: ${error.message}`;
  }
}

async function shareAction(event) {
  const form = $("#share-form");
  const action = event.submitter?.value;
  if (action === "copy") {
    event.preventDefault();
    try {
      await navigator.clipboard.writeText($("#share-link").value);
      $("#share-status").textContent = "Copied.";
    } catch {
      $("#share-link").select();
      $("#share-status").textContent = "Select the link and copy it.";
    }
  } else if (action === "revoke" && form.dataset.shareId) {
    event.preventDefault();
    const status = $("#share-status");
    if (
      await revoke(
        form.dataset.chatId,
        form.dataset.shareId,
        status,
        "Revoked: the link no longer opens.",
      )
    ) {
      $("#share-link").value = "";
      delete form.dataset.shareId;
    }
  }
}

export function showUsage(usage) {
  const budget = usage.budget.budget_tokens;
  $("#usage-tier").textContent = usage.tier;
  $("#usage-left").textContent =
    `${number.format(usage.remaining_budget)} of ${number.format(budget)} tokens ` +
    `(refills ${number.format(usage.budget.refill_tokens_per_hour)} an hour)`;
  $("#usage-meter").value = budget ? usage.remaining_budget / budget : 0;
  $("#usage-period").textContent = number.format(usage.period_tokens);
}

async function saveInstructions(event) {
  if (event.submitter?.value !== "save") return;
  event.preventDefault();
  try {
    const saved = await guarded(() => state.api.setInstructions($("#my-instructions").value));
    $("#my-instructions").value = saved.content;
    $("#account-status").textContent = "Saved.";
  } catch (error) {
    $("#account-status").textContent = error.message;
  }
}

/** After an answer: a notice while less than LOW_BUDGET of the budget is left (usage unavailable: none). */
export async function checkBudget() {
  let usage;
  try {
    usage = await guarded(() => state.api.usage());
  } catch {
    return;
  }
  const budget = usage.budget.budget_tokens;
  if (budget && usage.remaining_budget < budget * LOW_BUDGET) {
    const left = number.format(usage.remaining_budget);
    const refill = number.format(usage.budget.refill_tokens_per_hour);
    showBanner(
      `Your budget is nearly spent: ${left} tokens left. It refills by ${refill} tokens an hour.`,
      "capacity budget",
    );
  }
}

export function wireSettings() {
  $("#model-picker").addEventListener("change", pickModel);
  $("#account").addEventListener("click", openAccount);
  $("#erase-me").addEventListener("click", confirmErase);
  $("#account-form").addEventListener("submit", saveInstructions);
  $("#chat-settings").addEventListener("click", () => {
    $("#chat-instructions").value = state.chatSettings.instructions;
    $("#chat-status").textContent = "";
    $("#chat-dialog").showModal();
  });
  $("#chat-form").addEventListener("submit", saveChatInstructions);
  $("#share").addEventListener("click", shareChat);
  $("#share-form").addEventListener("submit", shareAction);
  wireMemories();
}
