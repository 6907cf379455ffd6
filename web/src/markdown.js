// Answers are markdown: rendered with marked, code blocks highlighted with highlight.js (the languages below;
// others are shown plain). Raw HTML in an answer is shown as text, never interpreted; the page additionally
// passes the result through DOMPurify (links, attributes) before it touches the DOM.
import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import c from "highlight.js/lib/languages/c";
import cpp from "highlight.js/lib/languages/cpp";
import css from "highlight.js/lib/languages/css";
import go from "highlight.js/lib/languages/go";
import java from "highlight.js/lib/languages/java";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import markdown from "highlight.js/lib/languages/markdown";
import python from "highlight.js/lib/languages/python";
import rust from "highlight.js/lib/languages/rust";
import sql from "highlight.js/lib/languages/sql";
import typescript from "highlight.js/lib/languages/typescript";
import xml from "highlight.js/lib/languages/xml";
import yaml from "highlight.js/lib/languages/yaml";
import { Marked } from "marked";

const LANGUAGES = {
  bash,
  c,
  cpp,
  css,
  go,
  java,
  javascript,
  json,
  markdown,
  python,
  rust,
  sql,
  typescript,
  xml,
  yaml,
};
for (const [name, language] of Object.entries(LANGUAGES)) hljs.registerLanguage(name, language);

export function escapeHtml(text) {
  return text.replace(
    /[&<>"']/g,
    (ch) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[ch],
  );
}

/** A fenced block's HTML: highlighted when its language is known (by name or alias: py, sh, js, html ...). */
export function codeBlock(text, lang) {
  const name = (lang || "").trim().split(/\s+/)[0].toLowerCase();
  const known = name && hljs.getLanguage(name);
  const body = known
    ? hljs.highlight(text, { language: name, ignoreIllegals: true }).value
    : escapeHtml(text);
  const label = known ? escapeHtml(name) : "text";
  return `<pre data-lang="${label}"><code class="hljs${known ? ` language-${label}` : ""}">${body}</code></pre>\n`;
}

const marked = new Marked({
  gfm: true,
  breaks: true, // the models write single newlines meaning line breaks
  renderer: {
    code: ({ text, lang }) => codeBlock(text, lang),
    html: ({ text }) => escapeHtml(text),
  },
});

/** The answer's HTML (not yet sanitized). An unfinished code fence renders as a code block in progress. */
export function toHtml(markdownText) {
  return marked.parse(markdownText, { async: false });
}
