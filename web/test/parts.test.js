import assert from "node:assert/strict";
import { test } from "node:test";
import { Announcer } from "../src/announce.js";
import { errorOf } from "../src/api.js";
import { toHtml } from "../src/markdown.js";
import { sseEvents } from "../src/sse.js";
import { response, sse, token } from "./helpers.js";

test("SSE events split across arbitrary chunks arrive whole, with ids and JSON data", async () => {
  const text = `${sse([token("r", 1, "a\nb"), token("r", 2, "ü")])}: ping\n\n`;
  for (const size of [1, 3, 64]) {
    const got = [];
    for await (const event of sseEvents(response(text, { size }))) got.push(event);
    assert.deepEqual(
      got.map((e) => [e.event, e.id, e.data.delta]),
      [
        ["token", "t:2:1", "a\nb"],
        ["token", "t:2:2", "ü"],
      ],
    );
  }
});

test("a 429 becomes an ApiError with its code, message and Retry-After", async () => {
  const body = JSON.stringify({
    error: {
      message: "Too many runs at once.",
      type: "rate_limit_error",
      code: "concurrency_limit_exceeded",
    },
  });
  const error = await errorOf(new Response(body, { status: 429, headers: { "retry-after": "7" } }));
  assert.deepEqual(
    [error.status, error.code, error.message, error.retryAfter],
    [429, "concurrency_limit_exceeded", "Too many runs at once.", 7],
  );
  const bare = await errorOf(new Response("oops", { status: 502 }));
  assert.deepEqual([bare.code, bare.retryAfter], ["http_502", null]);
});

test("markdown: fenced code is highlighted by language, raw HTML is shown as text", () => {
  const html = toHtml(
    "Try:\n\n```python\ndef f(x):\n    return 'hi'\n```\n\n<img src=x onerror=alert(1)>",
  );
  assert.match(html, /<pre data-lang="python"><code class="hljs language-python">/);
  assert.match(html, /<span class="hljs-keyword">def<\/span>/);
  assert.match(
    html,
    /<span class="hljs-string">&#x27;hi&#x27;<\/span>|<span class="hljs-string">'hi'<\/span>/,
  );
  assert.doesNotMatch(html, /<img/);
  assert.match(html, /&lt;img src=x onerror=alert\(1\)&gt;/);
  const open = toHtml("```js\nconst a = 1;"); // a fence still streaming
  assert.match(open, /<code class="hljs language-js">/);
});

test("the screen reader hears whole sentences, the rest at the end, and a retraction does not confuse it", () => {
  const a = new Announcer();
  assert.equal(a.next("The sea"), "");
  assert.equal(a.next("The sea is deep. It is"), "The sea is deep.");
  assert.equal(a.next("The sea is deep. It is cold"), "");
  assert.equal(a.rest("The sea is deep. It is cold"), "It is cold");
  const b = new Announcer();
  b.next("One. Two. ");
  assert.equal(b.next("One. "), ""); // withdrawn by moderation: shorter than what was read
  assert.equal(b.next("One. Three. "), "Three.");
});
