// The edge's HTTP interface, for the app: JSON calls and SSE streams, errors as ApiError (OpenAI-shaped bodies).

export class ApiError extends Error {
  constructor(status, code, message, retryAfter = null) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter; // seconds, from a 429's Retry-After
  }
}

/** An ApiError from a failed response (the edge answers {"error": {"message", "code", ...}}). */
export async function errorOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  const error = body && body.error ? body.error : {};
  const retry = Number.parseInt(response.headers.get("retry-after") || "", 10);
  return new ApiError(
    response.status,
    error.code || `http_${response.status}`,
    error.message || `The server answered ${response.status}.`,
    Number.isFinite(retry) ? retry : null,
  );
}

/** The app signs in with a server-side session: its cookie is HttpOnly (no script reads it), and each change
 * carries the session's CSRF token, which /v1/me hands to this page alone. */
export class Api {
  constructor({ base = "", fetch: fetcher = globalThis.fetch.bind(globalThis) } = {}) {
    this.csrf = null;
    this.base = base;
    this.fetch = fetcher;
  }

  headers(extra = {}) {
    return this.csrf ? { "X-CSRF-Token": this.csrf, ...extra } : { ...extra };
  }

  /** Exchange a development token (the link `make run` prints) for a session. */
  async tokenSignIn(token) {
    const response = await this.fetch(`${this.base}/auth/token`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ token }),
    });
    if (!response.ok) throw await errorOf(response);
  }

  /** Sign in with a local account (owner: make the install's first account, its owner's). */
  async localSignIn(username, password, owner = false) {
    const response = await this.fetch(`${this.base}/auth/local/${owner ? "owner" : "login"}`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ username, password }),
    });
    if (!response.ok) throw await errorOf(response);
  }

  methods() {
    return this.call("GET", "/auth/methods");
  }

  /** End the session here (and at the provider: the answer names its sign-out page, if any). */
  signOut() {
    return this.call("POST", "/auth/logout");
  }

  async call(method, path, body = undefined) {
    const init = { method, headers: this.headers() };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await this.fetch(this.base + path, init);
    if (!response.ok) throw await errorOf(response);
    return response.status === 204 ? null : response.json();
  }

  /** The chat's documents, each with how its reading went. */
  documents(chatId) {
    return this.call("GET", `/v1/chats/${chatId}/documents`);
  }

  /** Attach a file to the chat (a multipart form: the browser sets its boundary). */
  async attach(chatId, file) {
    const form = new FormData();
    form.append("file", file, file.name);
    const init = { method: "POST", headers: this.headers(), body: form };
    const response = await this.fetch(`${this.base}/v1/chats/${chatId}/documents`, init);
    if (!response.ok) throw await errorOf(response);
    return response.json();
  }

  detach(chatId, documentId) {
    return this.call("DELETE", `/v1/chats/${chatId}/documents/${documentId}`);
  }

  /** An open SSE response (status 200), or an ApiError. */
  async stream(method, path, { body, lastEventId, signal } = {}) {
    const headers = this.headers({ Accept: "text/event-stream" });
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (lastEventId) headers["Last-Event-ID"] = lastEventId;
    const init = {
      method,
      headers,
      signal,
      body: body === undefined ? undefined : JSON.stringify(body),
    };
    const response = await this.fetch(this.base + path, init);
    if (!response.ok) throw await errorOf(response);
    return response;
  }

  me() {
    return this.call("GET", "/v1/me");
  }
  eraseMe() {
    return this.call("DELETE", "/v1/me");
  }
  models() {
    return this.call("GET", "/v1/models");
  }
  usage() {
    return this.call("GET", "/v1/usage");
  }
  instructions() {
    return this.call("GET", "/v1/me/instructions");
  }
  setInstructions(content) {
    return this.call("PUT", "/v1/me/instructions", { content });
  }
  memories() {
    return this.call("GET", "/v1/me/memories");
  }
  addMemory(content) {
    return this.call("POST", "/v1/me/memories", { content });
  }
  editMemory(id, content) {
    return this.call("PATCH", `/v1/me/memories/${id}`, { content });
  }
  deleteMemory(id) {
    return this.call("DELETE", `/v1/me/memories/${id}`);
  }
  mySettings() {
    return this.call("GET", "/v1/me/settings");
  }
  changeMySettings(patch) {
    return this.call("PATCH", "/v1/me/settings", patch);
  }
  /** Change a chat's title, instructions or model (a field left out stays). */
  changeChat(id, patch) {
    return this.call("PATCH", `/v1/chats/${id}`, patch);
  }
  /** A page of chats (pinned first); `archived`: the archived ones instead, all at once. */
  chats(cursor = null, limit = 20, archived = false) {
    const query = new URLSearchParams({ limit: String(limit) });
    if (cursor) query.set("cursor", cursor);
    if (archived) query.set("archived", "true");
    return this.call("GET", `/v1/chats?${query}`);
  }
  chat(id) {
    return this.call("GET", `/v1/chats/${id}`);
  }
  newChat(title) {
    return this.call("POST", "/v1/chats", { title });
  }
  rename(id, title) {
    return this.changeChat(id, { title });
  }
  remove(id) {
    return this.call("DELETE", `/v1/chats/${id}`);
  }
  /** Every message of a chat, oldest first (the edge pages them 100 at a time). */
  async messages(id) {
    const all = [];
    let cursor = null;
    do {
      const query = new URLSearchParams({ limit: "100" });
      if (cursor) query.set("cursor", cursor);
      const page = await this.call("GET", `/v1/chats/${id}/messages?${query}`);
      all.push(...page.data);
      cursor = page.next_cursor;
    } while (cursor);
    return all;
  }
  cancel(chatId, runId) {
    return this.call("POST", `/v1/chats/${chatId}/runs/${runId}/cancel`);
  }
  feedback(chatId, messageId, rating) {
    return this.call("POST", `/v1/chats/${chatId}/messages/${messageId}/feedback`, { rating });
  }
  /** A new message (parent: the answer it follows, null for a new first message; left out: the branch's end). */
  send(chatId, content, signal, parent = undefined, tools = []) {
    const body = parent === undefined ? { content } : { content, parent_id: parent };
    if (tools.length) body.tools = tools;
    return this.stream("POST", `/v1/chats/${chatId}/messages`, { body, signal });
  }
  share(chatId) {
    return this.call("POST", `/v1/chats/${chatId}/share`, {});
  }
  shares() {
    return this.call("GET", "/v1/me/shares");
  }
  revokeShare(chatId, shareId) {
    return this.call("DELETE", `/v1/chats/${chatId}/share/${shareId}`);
  }
  /** The person's messages matching `q` (words, the last one as typed, and meaning), best first. */
  search(q) {
    return this.call("GET", `/v1/search?${new URLSearchParams({ q, limit: "20" })}`);
  }
  chooseBranch(chatId, messageId) {
    return this.call("PUT", `/v1/chats/${chatId}/branch`, { message_id: messageId });
  }
  regenerate(chatId, runId, signal) {
    return this.stream("POST", `/v1/chats/${chatId}/runs/${runId}/regenerate`, {
      body: {},
      signal,
    });
  }
  events(chatId, runId, lastEventId, signal) {
    return this.stream("GET", `/v1/chats/${chatId}/runs/${runId}/events`, { lastEventId, signal });
  }
}
