import assert from "node:assert/strict";
import { test } from "node:test";
import { ApiError } from "../src/api.js";
import { follow } from "../src/follow.js";
import { newRun } from "../src/run.js";
import { completed, response, sse, started, token } from "./helpers.js";

const noWait = async () => {};

test("a broken stream is resumed with Last-Event-ID and the answer has no gap and no duplicate", async () => {
  const events = [
    ...started("r1", 20),
    token("r1", 22, "The "),
    token("r1", 23, "sea "),
    token("r1", 24, "is "),
    token("r1", 25, "deep."),
    completed("r1", 26),
  ];
  const first = response(sse(events.slice(0, 4)), { breaks: true }); // breaks after "The sea "
  const asked = [];
  const api = {
    async events(chatId, runId, cursor) {
      asked.push([chatId, runId, cursor]);
      if (asked.length === 1) throw new TypeError("Failed to fetch"); // still offline: try again later
      return response(sse(events.slice(3))); // the edge replays from the cursor on; one overlap on purpose
    },
  };
  const connections = [];
  const updates = [];
  const run = await follow({
    api,
    chatId: "c1",
    run: newRun(),
    first,
    sleep: noWait,
    onUpdate: (r) => updates.push(r.text),
    onConnection: (c) => connections.push(c),
  });
  assert.equal(run.text, "The sea is deep.");
  assert.equal(run.status, "done");
  assert.deepEqual(asked, [
    ["c1", "r1", "t:2:23"],
    ["c1", "r1", "t:2:23"],
  ]);
  assert.deepEqual(connections, ["live", "reconnecting", "live"]);
  assert.ok(
    updates.every((text, i) => i === 0 || text.startsWith(updates[i - 1])),
    "the text only ever grows",
  );
});

test("a stream that ends without the run's end is read again from its cursor", async () => {
  const events = [
    ...started("r1", 0),
    token("r1", 2, "a"),
    token("r1", 3, "b"),
    completed("r1", 4),
  ];
  let calls = 0;
  const api = {
    events: async (_c, _r, cursor) => (
      calls++,
      assert.equal(cursor, "t:2:2"),
      response(sse(events.slice(3)))
    ),
  };
  const run = await follow({
    api,
    chatId: "c",
    run: newRun(),
    first: response(sse(events.slice(0, 3))),
    sleep: noWait,
    onUpdate() {},
  });
  assert.equal(run.text, "ab");
  assert.equal(calls, 1);
});

test("resuming after a reload reads the run from its start", async () => {
  const events = [...started("r9", 0), token("r9", 2, "x"), completed("r9", 3)];
  const api = {
    events: async (_c, runId, cursor) => (
      assert.deepEqual([runId, cursor], ["r9", null]),
      response(sse(events))
    ),
  };
  const run = await follow({ api, chatId: "c", run: newRun("r9"), sleep: noWait, onUpdate() {} });
  assert.deepEqual([run.text, run.status], ["x", "done"]);
});

test("a chat deleted meanwhile (404) ends the answer with an error instead of retrying forever", async () => {
  const api = {
    events: async () => {
      throw new ApiError(404, "chat_not_found", "No chat found.");
    },
  };
  const run = await follow({ api, chatId: "c", run: newRun("r1"), sleep: noWait, onUpdate() {} });
  assert.deepEqual([run.status, run.error.code], ["error", "chat_not_found"]);
});

test("aborting stops following without touching the run", async () => {
  const controller = new AbortController();
  const api = {
    events: async () => {
      controller.abort();
      throw new DOMException("aborted", "AbortError");
    },
  };
  const run = await follow({
    api,
    chatId: "c",
    run: newRun("r1"),
    signal: controller.signal,
    sleep: noWait,
    onUpdate() {},
  });
  assert.equal(run.status, "waiting");
});
