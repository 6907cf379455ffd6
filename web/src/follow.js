// Following one run to its end across broken connections: the answer's stream is read from the POST that
// started it (or from the run's events route), and whenever the connection breaks before the run's terminal
// event, the events route is asked again with Last-Event-ID = the last cursor applied. The edge replays the
// run's log after that cursor, and run.apply ignores anything already applied: no gap, no duplicate.
import { ApiError } from "./api.js";
import { apply, isFinished } from "./run.js";
import { sseEvents } from "./sse.js";

export const BACKOFF_MS = [250, 500, 1000, 2000, 4000, 5000];

export function pause(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      globalThis.removeEventListener?.("online", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
    globalThis.addEventListener?.("online", done, { once: true }); // back online: try now, not at the next tick
  });
}

/** A client error other than 429 will not go away by asking again (the chat was deleted, the credential expired). */
function permanent(error) {
  return (
    error instanceof ApiError && error.status < 500 && error.status !== 429 && error.status !== 408
  );
}

/**
 * Read the run's events until it ends; returns the finished run (or the run so far, when `signal` aborts).
 * first: an open SSE response to read before reconnecting (the POST's); onUpdate(run) after each change;
 * onConnection("live" | "reconnecting") whenever that changes.
 */
export async function follow({
  api,
  chatId,
  run,
  first = null,
  signal,
  onUpdate,
  onConnection = () => {},
  sleep = pause,
}) {
  let response = first;
  let attempt = 0;
  let connection = null;
  const say = (value) => {
    if (value !== connection) onConnection((connection = value));
  };
  while (!isFinished(run) && !signal?.aborted) {
    try {
      if (!response) {
        if (!run.runId)
          throw new ApiError(0, "connection_lost", "The connection broke before the answer began.");
        response = await api.events(chatId, run.runId, run.cursor, signal);
      }
      say("live");
      for await (const event of sseEvents(response)) {
        const next = apply(run, event);
        if (next !== run) {
          run = next;
          attempt = 0;
          onUpdate(run);
        }
        if (isFinished(run)) break;
      }
    } catch (error) {
      if (signal?.aborted) break;
      if (permanent(error) || !run.runId) {
        run = {
          ...run,
          status: "error",
          error: { code: error.code || "connection_lost", message: error.message },
        };
        onUpdate(run);
        break;
      }
    }
    response = null;
    if (isFinished(run) || signal?.aborted) break;
    say("reconnecting"); // the body ended or broke before the run's end: an edge restarted, the network dropped
    await sleep(BACKOFF_MS[Math.min(attempt++, BACKOFF_MS.length - 1)], signal);
  }
  if (isFinished(run)) say("live");
  return run;
}
