// The person's memories in the account dialog: the switch that recalls them into their chats, each memory
// editable in place and deletable, and a box to add one. The server checks each one before keeping it.
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

export function wireMemories() {
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
