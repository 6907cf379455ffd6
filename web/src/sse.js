// Server-sent events from a fetch() response. The browser's EventSource cannot send an Authorization header
// or a POST body, so the app reads the stream itself; eventsource-parser does the parsing.
import { createParser } from "eventsource-parser";

/** Yields {event, id, data} (data JSON-decoded) until the body ends; throws if the connection breaks. */
export async function* sseEvents(response) {
  const queue = [];
  const parser = createParser({
    onEvent(message) {
      let data;
      try {
        data = JSON.parse(message.data);
      } catch {
        return; // not one of ours (the edge only sends JSON); skip rather than break the answer
      }
      queue.push({ event: message.event || "message", id: message.id || null, data });
    },
  });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      parser.feed(decoder.decode(value, { stream: true }));
      while (queue.length) yield queue.shift();
    }
  } finally {
    reader.releaseLock?.();
  }
  while (queue.length) yield queue.shift();
}
