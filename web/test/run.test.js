import assert from "node:assert/strict";
import { test } from "node:test";
import { apply, fromMessage, isFinished, newRun, seen, toMessage } from "../src/run.js";
import { completed, started, token } from "./helpers.js";

const play = (events, run = newRun()) => events.reduce(apply, run);

test("a streamed answer: queued, started, tokens in order, completed with usage", () => {
  const run = play([
    ...started("r1", 10),
    token("r1", 12, "Hel"),
    token("r1", 13, "lo."),
    completed("r1", 14),
  ]);
  assert.equal(run.text, "Hello.");
  assert.equal(run.status, "done");
  assert.equal(run.pool, "small");
  assert.equal(run.model, "m");
  assert.equal(run.cursor, "t:2:14");
  assert.deepEqual(run.usage, { prompt_tokens: 3, completion_tokens: 4, cached_tokens: 0 });
  assert.ok(isFinished(run));
});

test("events at or before the last applied cursor change nothing: a replay cannot duplicate text", () => {
  const first = play([...started("r1", 10), token("r1", 12, "one "), token("r1", 13, "two ")]);
  const replayed = play(
    [
      ...started("r1", 10),
      token("r1", 12, "one "),
      token("r1", 13, "two "),
      token("r1", 14, "three"),
    ],
    first,
  );
  assert.equal(replayed.text, "one two three");
  assert.ok(seen(first, "t:2:13") && !seen(first, "t:2:14"));
});

test("a cancelled run is stopped, keeping its partial answer", () => {
  const run = play([
    ...started("r1", 0),
    token("r1", 2, "Once upon"),
    completed("r1", 3, "cancelled"),
  ]);
  assert.equal(run.status, "stopped");
  assert.equal(run.text, "Once upon");
});

test("a retraction drops the text from retract_from and says why", () => {
  const retract = {
    event: "moderation",
    id: "t:2:5",
    data: { run_id: "r1", action: "retract", category: "violence", retract_from: 6, message: "m" },
  };
  const run = play([
    ...started("r1", 0),
    token("r1", 2, "Fine. "),
    token("r1", 3, "Bad part"),
    retract,
    completed("r1", 6, "content_filter"),
  ]);
  assert.equal(run.text, "Fine. ");
  assert.equal(run.moderation.category, "violence");
  assert.equal(run.status, "done");
});

test("a retraction counts characters as the server does: an emoji before the cut is one, not two", () => {
  const retract = {
    event: "moderation",
    id: "t:2:5",
    data: { run_id: "r1", action: "retract", category: "toxic", retract_from: 8, message: "m" },
  };
  const run = play([
    ...started("r1", 0),
    token("r1", 2, "Fine \u{1F600}. "),
    token("r1", 3, "Bad part"),
    retract,
  ]);
  assert.equal(run.text, "Fine \u{1F600}. ");
});

test("a refusal and an error end the run; nothing after them applies", () => {
  const refusal = {
    event: "moderation",
    id: "r:2:9",
    data: { run_id: "r1", action: "refused", category: "weapons", message: "No." },
  };
  const refused = play([refusal, token("r1", 10, "late")]);
  assert.equal(refused.status, "refused");
  assert.equal(refused.text, "");
  const failed = play([
    ...started("r1", 0),
    { event: "error", id: null, data: { run_id: "r1", code: "timeout", message: "No progress." } },
  ]);
  assert.deepEqual([failed.status, failed.error.code], ["error", "timeout"]);
});

test("stored answers render like live ones", () => {
  const base = { id: "r1", role: "assistant", run_id: "r1", model: "m", pool: "small" };
  assert.equal(fromMessage({ ...base, content: "Hi", finish_reason: "stop" }).status, "done");
  assert.equal(
    fromMessage({ ...base, content: "Hi", finish_reason: "cancelled" }).status,
    "stopped",
  );
  const refusal = fromMessage({
    ...base,
    model: null,
    content: "Not allowed.",
    finish_reason: "content_filter",
  });
  assert.deepEqual(
    [refusal.status, refusal.text, refusal.moderation.message],
    ["refused", "", "Not allowed."],
  );
  const retracted = fromMessage({ ...base, content: "Partial", finish_reason: "content_filter" });
  assert.deepEqual(
    [retracted.status, retracted.text, retracted.moderation.action],
    ["done", "Partial", "retract"],
  );
  const rejected = fromMessage({
    ...base,
    model: null,
    content: "Too many at once.",
    finish_reason: "concurrency_limit_exceeded",
  });
  assert.deepEqual([rejected.status, rejected.error.message], ["error", "Too many at once."]);
});

test("a finished live answer becomes the message it is stored as, and reads back alike", () => {
  const done = play([...started("r1", 0), token("r1", 2, "Hi."), completed("r1", 3)]);
  assert.deepEqual(toMessage(done), {
    id: "r1",
    role: "assistant",
    content: "Hi.",
    run_id: "r1",
    model: "m",
    pool: "small",
    finish_reason: "stop",
    feedback: null,
    memories: [],
    sources: [],
    tools: [],
  });
  const [queued, ...rest] = started("r4", 0);
  const source = {
    n: 1,
    document_id: "d1",
    name: "guide.pdf",
    place: "page 1",
    text: "Built in 1902.",
  };
  const recalled = {
    ...queued,
    data: { ...queued.data, memories: ["I prefer metric units."], sources: [source] },
  };
  const remembering = toMessage(play([recalled, ...rest, completed("r4", 3)]));
  assert.deepEqual(remembering.memories, ["I prefer metric units."]);
  assert.deepEqual(fromMessage(remembering).memories, ["I prefer metric units."]);
  assert.deepEqual(fromMessage(remembering).sources, [source]);
  const refusal = {
    event: "moderation",
    id: "r:2:9",
    data: { run_id: "r2", action: "refused", category: "weapons", message: "No." },
  };
  const refused = toMessage(play([refusal]));
  assert.deepEqual(
    [refused.content, refused.finish_reason, refused.model],
    ["No.", "content_filter", null],
  );
  assert.equal(fromMessage(refused).status, "refused");
  const failed = toMessage(
    play([
      {
        event: "error",
        id: null,
        data: { run_id: "r3", code: "timeout", message: "No progress." },
      },
    ]),
  );
  assert.equal(failed.content, "No progress.");
});

test("a call to a registered tool shows running, then its result, and is stored with the answer", () => {
  const call = {
    id: "c1",
    type: "function",
    function: { name: "calc__add", arguments: '{"a":2}' },
  };
  const calls = { event: "tool.calls", id: "t:0:3", data: { run_id: "r5", tool_calls: [call] } };
  const result = {
    event: "tool.result",
    id: "t:0:4",
    data: {
      run_id: "r5",
      call_id: "c1",
      name: "calc__add",
      arguments: '{"a":2}',
      status: "ok",
      content: "5",
      duration_ms: 12,
    },
  };
  const running = play([...started("r5", 0), calls]);
  assert.deepEqual(
    running.tools.map((t) => t.status),
    ["running"],
  );
  const done = play([
    ...started("r5", 0),
    calls,
    result,
    token("r5", 5, "It is 5."),
    completed("r5", 6),
  ]);
  assert.deepEqual(
    done.tools.map((t) => [t.name, t.status, t.content]),
    [["calc__add", "ok", "5"]],
  );
  assert.equal(done.text, "It is 5.");
  assert.deepEqual(fromMessage(toMessage(done)).tools, done.tools);
});

test("a question the policy redacted: the stream opens with it as kept, and the answer follows as usual", () => {
  const kept = { content: "Mail [redacted email]", kinds: ["email"] };
  const run = play([
    { event: "message.redacted", id: "", data: { message_id: "q1", ...kept } },
    ...started("r1", 10),
    token("r1", 12, "Done."),
    completed("r1", 13),
  ]);
  assert.deepEqual(run.redacted, kept);
  assert.equal(run.text, "Done.");
  assert.equal(run.status, "done");
  assert.equal(newRun().redacted, null);
});
