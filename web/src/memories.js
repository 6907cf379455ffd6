// The person's own settings in the account dialog: their memories (the switch that recalls them into their
// chats, each memory editable in place and deletable, a box to add one; the server checks each one before
// keeping it), and after how many days untouched their chats are deleted.
import { guarded } from "./page.js";
import { $, h, state } from "./state.js";

function say(text) {
  $("#memory-status").textContent = text;
}

/** Do `change` and redraw the list; its error, if any, is said in the dialog. */
async function changed(change, done) {
  try {
    await guarded(change);
    say(done);
  } catch (error) {
    say(error.message);
  }
  await listMemories();
}

function item(memory, index) {
  const input = h("input", {
    type: "text",
    value: memory.content,
    maxlength: "500",
    "aria-label": `Memory ${index + 1}`,
  });
  const button = (label, action, text) =>
    h(
      "button",
      {
        type: "button",
        class: "text",
        "aria-label": `${label} memory ${index + 1}`,
        onclick: action,
      },
      text,
    );
  return h(
    "li",
    { "data-memory-id": memory.id },
    input,
    button(
      "Save",
      () => changed(() => state.api.editMemory(memory.id, input.value), "Memory saved."),
      "Save",
    ),
    button(
      "Delete",
      () => changed(() => state.api.deleteMemory(memory.id), "Memory deleted."),
      "Delete",
    ),
  );
}

/** The person's memories and whether they are used, as the server has them now. */
export async function listMemories() {
  try {
    const [listed, mine] = await Promise.all([
      guarded(() => state.api.memories()),
      guarded(() => state.api.mySettings()),
    ]);
    $("#my-memories").replaceChildren(...listed.data.map(item));
    $("#use-memories").checked = mine.memories;
    showKeeping(mine);
    $("#use-memories").disabled = !mine.memories_available;
    if (!mine.memories_available) say("Memories are switched off on this deployment.");
  } catch (error) {
    say(`Memories are unavailable: ${error.message}`);
  }
}

async function addMemory() {
  const content = $("#new-memory").value.trim();
  if (!content) return;
  await changed(() => state.api.addMemory(content), "Memory kept.");
  if ($("#memory-status").textContent === "Memory kept.") $("#new-memory").value = "";
}

function showKeeping(mine) {
  $("#delete-after").value = mine.delete_after_days ?? "";
  if (mine.max_chat_age_days) $("#delete-after").max = String(mine.max_chat_age_days);
  $("#delete-after-hint").textContent = mine.max_chat_age_days
    ? `This deployment deletes any chat untouched for ${mine.max_chat_age_days} days. Pinned chats are kept past your own choice.`
    : "Pinned chats are kept.";
}

async function saveKeeping() {
  const value = $("#delete-after").value.trim();
  const days = value === "" ? null : Number(value);
  try {
    const mine = await guarded(() => state.api.changeMySettings({ delete_after_days: days }));
    showKeeping(mine);
    say(days ? `Chats untouched for ${days} days will be deleted.` : "Your chats are kept.");
  } catch (error) {
    say(error.message);
  }
}

export function wireMemories() {
  $("#save-delete-after").addEventListener("click", saveKeeping);
  $("#add-memory").addEventListener("click", addMemory);
  $("#new-memory").addEventListener("keydown", (event) => {
    if (event.key === "Enter") {
      event.preventDefault();
      addMemory();
    }
  });
  $("#use-memories").addEventListener("change", (event) =>
    changed(
      () => state.api.changeMySettings({ memories: event.target.checked }),
      event.target.checked
        ? "Your memories are used in your chats."
        : "Your memories are not used.",
    ),
  );
}
