// The open chat's documents: attach a file (the paperclip beside the message box), see each one's reading
// (reading…, ready, or why it failed), remove one. The server reads a file in the background, so while one is
// being read the list is asked again every second; the chat's next answers hold the passages and list them
// under the answer as its sources.
import { ensureChat } from "./composer.js";
import { icon } from "./icons.js";
import { guarded, showBanner } from "./page.js";
import { $, h, state } from "./state.js";

let shown = null; // the chat whose documents are listed
let timer = null;

const STATUS = { reading: "reading…", ready: "ready", failed: "could not be read" };

function item(chatId, doc) {
  const label = `Remove ${doc.name}`;
  const remove = h(
    "button",
    { type: "button", class: "icon remove", "aria-label": label, title: label },
    icon("close"),
  );
  remove.addEventListener("click", async () => {
    try {
      await guarded(() => state.api.detach(chatId, doc.id));
    } catch (error) {
      showBanner(`Could not remove ${doc.name}: ${error.message}`);
    }
    await showDocuments(chatId);
  });
  const why = doc.error ? h("span", { class: "why" }, doc.error.message) : null;
  return h(
    "li",
    { class: `document ${doc.status}`, "data-document-id": doc.id },
    h("span", { class: "name" }, doc.name),
    h("span", { class: "status" }, STATUS[doc.status] || doc.status),
    why,
    remove,
  );
}

/** List the chat's documents (none: the list hides); asked again each second while one is being read. */
export async function showDocuments(chatId) {
  clearTimeout(timer);
  shown = chatId;
  const list = $("#documents");
  if (!chatId) {
    list.replaceChildren();
    list.hidden = true;
    return;
  }
  let docs = [];
  try {
    docs = (await guarded(() => state.api.documents(chatId))).data;
  } catch {
    docs = [];
  }
  if (shown !== chatId) return; // another chat was opened meanwhile
  list.replaceChildren(...docs.map((doc) => item(chatId, doc)));
  list.hidden = docs.length === 0;
  if (docs.some((doc) => doc.status === "reading")) {
    timer = setTimeout(() => showDocuments(chatId), 1000);
  }
}

async function attach(file) {
  const chatId = await ensureChat(file.name);
  if (!chatId) return;
  try {
    await guarded(() => state.api.attach(chatId, file));
  } catch (error) {
    showBanner(`${file.name} was not attached: ${error.message}`);
  }
  await showDocuments(chatId);
}

export function wireDocuments() {
  const input = $("#attach-input");
  $("#attach").addEventListener("click", () => input.click());
  input.addEventListener("change", async () => {
    const files = [...input.files];
    input.value = "";
    for (const file of files) await attach(file);
  });
}
