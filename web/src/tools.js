// The registered MCP servers' tools offered to the person (GET /v1/tools): a picker beside the message box.
// The tools ticked go with each message sent: the answer calls them first, then may call them again, and each
// call and its result shows under the answer (conversation.js). Nothing is offered: the picker stays hidden.
import { $, h, state } from "./state.js";

export const chosen = new Set();

function sync() {
  const button = $("#tools-button");
  button.textContent = chosen.size ? `Tools (${chosen.size})` : "Tools";
  button.setAttribute("aria-pressed", String(chosen.size > 0));
}

export async function loadTools() {
  let list;
  try {
    list = await state.api.call("GET", "/v1/tools");
  } catch {
    return; // no tools: the picker stays hidden
  }
  const tools = list.data || [];
  const picker = $("#tools-picker");
  for (const name of [...chosen]) if (!tools.some((t) => t.name === name)) chosen.delete(name);
  picker.replaceChildren(
    h("legend", {}, "Tools the answer uses"),
    ...tools.map((tool) => {
      const box = h("input", { type: "checkbox", value: tool.name });
      box.checked = chosen.has(tool.name);
      box.addEventListener("change", () => {
        if (box.checked) chosen.add(tool.name);
        else chosen.delete(tool.name);
        sync();
      });
      return h("label", { title: tool.description }, box, ` ${tool.name}`);
    }),
  );
  $("#tools-button").hidden = tools.length === 0;
  sync();
}

export function wireTools() {
  const button = $("#tools-button");
  button.addEventListener("click", () => {
    const picker = $("#tools-picker");
    picker.hidden = !picker.hidden;
    button.setAttribute("aria-expanded", String(!picker.hidden));
  });
}
