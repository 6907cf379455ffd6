// Fakes for the unit tests: SSE bodies as fetch() would deliver them (in arbitrary chunks, possibly breaking).

export function sse(events) {
  return events
    .map(
      ({ event, id, data }) =>
        `${id ? `id: ${id}\n` : ""}event: ${event}\ndata: ${JSON.stringify(data)}\n\n`,
    )
    .join("");
}

/** A Response whose body yields `text` in chunks of `size` bytes, then ends, or breaks when `breaks` is set. */
export function response(text, { size = 7, breaks = false, status = 200, headers = {} } = {}) {
  const bytes = new TextEncoder().encode(text);
  let at = 0;
  const body = new ReadableStream({
    pull(controller) {
      if (at < bytes.length) {
        controller.enqueue(bytes.slice(at, at + size));
        at += size;
      } else if (breaks) controller.error(new TypeError("network error"));
      else controller.close();
    },
  });
  return new Response(body, {
    status,
    headers: { "content-type": "text/event-stream", ...headers },
  });
}

export const started = (run, offset) => [
  {
    event: "run.queued",
    id: `t:2:${offset}`,
    data: { run_id: run, chat_id: "c", model: "m", pool: "small" },
  },
  {
    event: "run.started",
    id: `t:2:${offset + 1}`,
    data: { run_id: run, chat_id: "c", model: "m" },
  },
];

export const token = (run, offset, delta) => ({
  event: "token",
  id: `t:2:${offset}`,
  data: { run_id: run, delta },
});

export const completed = (run, offset, finish = "stop") => ({
  event: "run.completed",
  id: `t:2:${offset}`,
  data: {
    run_id: run,
    finish_reason: finish,
    model: "m",
    usage: { prompt_tokens: 3, completion_tokens: 4, cached_tokens: 0 },
  },
});
