// What an answer drew on, shown under it: the passages of the chat's documents its context held (cited as [n]),
// and its calls to registered tools with their results.
import { h } from "./state.js";

/** The passages of the chat's documents the answer's context held, each one a disclosure showing its text:
 * the answer cites them as [n]. */
export function sourcesList(run) {
  if (!run.sources?.length) return null;
  const items = run.sources.map((s) =>
    h(
      "li",
      {},
      h(
        "details",
        {},
        h("summary", {}, `[${s.n}] ${s.name}${s.place ? `, ${s.place}` : ""}`),
        h("blockquote", { class: "passage" }, s.text),
      ),
    ),
  );
  return h(
    "section",
    { class: "sources", "aria-label": "Sources" },
    h("p", { class: "sources-title" }, "Sources"),
    h("ol", {}, ...items),
  );
}

/** The answer's calls to registered tools, each a disclosure with its arguments and the result the model read. */
export function toolsList(run) {
  if (!run.tools?.length) return null;
  const items = run.tools.map((t) =>
    h(
      "li",
      { class: `tool ${t.status}` },
      h(
        "details",
        {},
        h("summary", {}, `${t.name}(${t.arguments}): ${t.status}`),
        h("pre", { class: "tool-result" }, t.content || "…"),
      ),
    ),
  );
  return h(
    "section",
    { class: "tools", "aria-label": "Tool calls" },
    h("p", { class: "sources-title" }, "Tools used"),
    h("ol", {}, ...items),
  );
}
