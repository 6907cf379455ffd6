// One answer's state, built from the run's SSE events (pure: the browser and the unit tests share it).
//
// Events carry cursors "t:<partition>:<offset>" (r:... for a refusal). A resumed stream starts after the last
// cursor applied, and an event at or before it is ignored, so a replay can never show text twice.

export function newRun(runId = null) {
  return {
    runId,
    status: "waiting", // waiting | queued | streaming | done | stopped | refused | error
    text: "",
    model: null,
    pool: null,
    degradedFrom: null,
    estimatedWaitMs: null,
    finishReason: null,
    usage: null,
    memories: [], // the person's memories its context recalled
    sources: [], // the passages of the chat's documents its context held: {n, name, place, text}
    tools: [], // its calls to registered tools: {call_id, name, arguments, status, content}; status running until answered
    moderation: null, // {action: "refused" | "retract", category, message}
    error: null, // {code, message}
    redacted: null, // {content, kinds}: the question as kept, when the policy took something out of it
    cursor: null, // the last applied event's id: a resume's Last-Event-ID
  };
}

const TERMINAL = new Set(["done", "stopped", "refused", "error"]);

export function isFinished(run) {
  return TERMINAL.has(run.status);
}

function offsetOf(cursor) {
  const parts = typeof cursor === "string" ? cursor.split(":") : [];
  return parts.length === 3
    ? { kind: parts[0], partition: Number(parts[1]), offset: Number(parts[2]) }
    : null;
}

/** True when an event with this cursor was already applied (same partition, not later). */
export function seen(run, cursor) {
  const last = offsetOf(run.cursor);
  const next = offsetOf(cursor);
  return Boolean(last && next && last.partition === next.partition && next.offset <= last.offset);
}

/** The run after one SSE event {event, id, data}; the same object back when the event changes nothing. */
export function apply(run, { event, id, data }) {
  if (id && seen(run, id)) return run;
  if (isFinished(run)) return run;
  const next = { ...run, cursor: id || run.cursor, runId: run.runId || data.run_id || null };
  switch (event) {
    case "run.queued":
      return {
        ...next,
        status: run.status === "waiting" ? "queued" : run.status,
        model: data.model ?? run.model,
        pool: data.pool ?? run.pool,
        degradedFrom: data.degraded_from ?? null,
        estimatedWaitMs: data.estimated_wait_ms ?? null,
        memories: data.memories ?? run.memories,
        sources: data.sources ?? run.sources,
      };
    case "run.started":
      return { ...next, status: "streaming", model: data.model ?? run.model };
    case "message.redacted": // the question as kept: the tier's policy took secrets or personal data out
      return { ...next, redacted: { content: data.content, kinds: data.kinds } };
    case "tool.calls": {
      const calls = data.tool_calls.map((c) => ({
        call_id: c.id,
        name: c.function.name,
        arguments: c.function.arguments,
        status: "running",
        content: "",
      }));
      return { ...next, status: "streaming", tools: [...run.tools, ...calls] };
    }
    case "tool.result": {
      const { run_id: _, ...use } = data;
      const known = run.tools.some((t) => t.call_id === use.call_id);
      const tools = known
        ? run.tools.map((t) => (t.call_id === use.call_id ? use : t))
        : [...run.tools, use];
      return { ...next, tools };
    }
    case "token":
      return { ...next, status: "streaming", text: run.text + data.delta };
    case "moderation":
      if (data.action === "retract") {
        // retract_from counts Unicode code points (the server's string offsets), not UTF-16 units: an emoji
        // before the cut is one character there and two in a JS string.
        const cut = Number.isInteger(data.retract_from) ? data.retract_from : 0;
        return {
          ...next,
          text: Array.from(run.text).slice(0, cut).join(""),
          moderation: { ...data },
        };
      }
      return {
        ...next,
        status: "refused",
        moderation: { ...data },
        finishReason: "content_filter",
      };
    case "run.completed":
      return {
        ...next,
        status: data.finish_reason === "cancelled" ? "stopped" : "done",
        finishReason: data.finish_reason,
        model: data.model ?? run.model,
        usage: data.usage ?? null,
      };
    case "error":
      return { ...next, status: "error", error: { code: data.code, message: data.message } };
    default:
      return run;
  }
}

/** A stored answer (GET messages) as a finished run, so history and live answers render alike. */
export function fromMessage(message) {
  const run = newRun(message.run_id || message.id);
  const reason = message.finish_reason;
  const base = {
    ...run,
    text: message.content || "",
    model: message.model,
    pool: message.pool,
    finishReason: reason,
    memories: message.memories || [],
    sources: message.sources || [],
    tools: message.tools || [],
  };
  if (reason === "cancelled") return { ...base, status: "stopped" };
  if (reason === "content_filter" && !message.model) {
    return {
      ...base,
      text: "",
      status: "refused",
      moderation: { action: "refused", message: message.content },
    };
  }
  if (reason === "content_filter") {
    return { ...base, status: "done", moderation: { action: "retract", message: null } };
  }
  if (!reason || ["stop", "length", "tool_calls"].includes(reason))
    return { ...base, status: "done" };
  // A run the pipeline refused or that failed (over budget, over capacity, expired): the stored text says why.
  return { ...base, text: "", status: "error", error: { code: reason, message: message.content } };
}

/** A finished answer as the message it is stored as (what fromMessage reads back): an answer's id is its run's. */
export function toMessage(run) {
  const notice =
    run.status === "refused"
      ? run.moderation?.message
      : run.status === "error"
        ? run.error?.message
        : null;
  return {
    id: run.runId,
    role: "assistant",
    content: notice === null ? run.text : notice || "",
    run_id: run.runId,
    model: run.model,
    pool: run.pool,
    finish_reason: run.finishReason,
    feedback: null,
    memories: run.memories,
    sources: run.sources,
    tools: run.tools,
  };
}
