// @rngrid/client: the grid's commands from JavaScript/TypeScript, through `rngrid serve`.
//
//   import { Commands } from "./index.js";
//   const { text, usage } = await Commands.execute("ai/inference", { model: "smollm2-135m", prompt: "Hi" });
//   for await (const event of Commands.execute("genome/train", { ... })) { ... }
//   const { text, segments } = await Commands.execute("audio/transcribe", { audio: base64OfTheFile });
//
// Plain ES module for Node.js >= 18 and browsers (fetch + web streams); types in index.d.ts.
// It speaks POST /v1/grid/execute, whose answer is the command's events as NDJSON, or
// /v1/grid/ws (client.socket()): the same events for many commands over one WebSocket.

const DEFAULT_URL = "http://127.0.0.1:8080";

/** An error from the grid or the gateway: `code` is the grid's (busy, not_allowed, unknown_model, ...). */
export class GridError extends Error {
  constructor(code, message, { status = null, retryAfter = null, param = null } = {}) {
    super(`${code}: ${message}`);
    this.name = "GridError";
    this.code = code;
    this.status = status;
    this.retryAfter = retryAfter;
    this.param = param;
  }
}

function env(name) {
  return typeof process !== "undefined" && process.env ? process.env[name] : undefined;
}

async function errorFrom(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON: fall through to the status line
  }
  const error = body && body.error ? body.error : {};
  const header = response.headers.get("retry-after");
  const retryAfter = error.retry_after ?? (header ? Number(header) : null);
  return new GridError(error.code || `http_${response.status}`, error.message || response.statusText,
    { status: response.status, retryAfter, param: error.param ?? null });
}

async function* ndjson(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let nl;
      while ((nl = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, nl).trim();
        buffer = buffer.slice(nl + 1);
        if (line) yield JSON.parse(line);
      }
    }
    if (buffer.trim()) yield JSON.parse(buffer);
  } finally {
    reader.releaseLock();
  }
}

// The whole tool calls of an inference, from its tool_call events (pieces of each call's JSON arguments).
function toolCalls(events) {
  const calls = [];
  for (const e of events.filter((e) => e.type === "tool_call")) {
    const call = (calls[e.index] ||= { id: "", name: "", arguments: "" });
    call.id ||= e.id;
    call.name ||= e.name;
    call.arguments += e.arguments;
  }
  return calls.filter(Boolean);
}

function base64Bytes(text) {
  const raw = atob(text);
  return Uint8Array.from(raw, (c) => c.charCodeAt(0));
}

// What `await run` (or run.result()) gives for each command, from its events.
const RESULTS = {
  "ai/inference": (events) => {
    const text = events.filter((e) => e.type === "token").map((e) => e.text).join("");
    const { type, ...usage } = events.find((e) => e.type === "usage") || {};
    return { text, usage, tool_calls: toolCalls(events) };
  },
  "ai/embeddings": (events) => {
    const { type, ...result } = events.find((e) => e.type === "embeddings") || { vectors: [] };
    return result;
  },
  "genome/train": (events) => {
    const job = events.find((e) => e.type === "job") || {};
    return { job_id: job.job_id, tower: job.tower, end: events.find((e) => e.type === "end") || null };
  },
  "jobs/watch": (events) => events.find((e) => e.type === "end") || null,
  "jobs/status": (events) => (events.find((e) => e.type === "jobs") || { jobs: [] }).jobs,
  "jobs/cancel": (events) => (events.find((e) => e.type === "status") || {}).job,
  "caps/full": (events) => (events.find((e) => e.type === "result") || {}).reply,
  "audio/transcribe": (events) => {
    const segments = events.filter((e) => e.type === "segment").map(({ type, ...s }) => s);
    const { type, text, ...end } = events.find((e) => e.type === "transcript") || {};
    return { text: text ?? segments.map((s) => s.text).join(" "), segments, end };
  },
  "audio/speech": (events) => {
    const audio = events.find((e) => e.type === "audio") || {};
    const { type, ...end } = events.find((e) => e.type === "speech") || {};
    return { format: audio.format, audio: audio.data ? base64Bytes(audio.data) : new Uint8Array(), end };
  },
  "grid/towers": (events) => (events.find((e) => e.type === "towers") || { towers: [] }).towers,
  "grid/models": (events) => (events.find((e) => e.type === "models") || { models: [] }).models,
};

/**
 * What every run of a command gives besides its events (CommandRun, SocketRun):
 * await it for the command's result. A subclass iterates the events and says
 * whether cancel() ended it first (`cancelled`).
 */
class Run {
  /** Whether cancel() was called before the command's events ended. */
  get cancelled() {
    return this._cancelled && !this._ended;
  }

  /** All events, then the command's result (e.g. {text, usage, tool_calls} for ai/inference).
   * Rejects with GridError("cancelled") when cancel() ended it first. */
  async result() {
    const events = [];
    for await (const event of this) events.push(event);
    if (this.cancelled) throw new GridError("cancelled", `${this.command} was cancelled before it ended`);
    const pick = RESULTS[this.command];
    return pick ? pick(events) : events;
  }

  /** ai/inference: just the text. */
  async text() {
    return (await this.result()).text;
  }

  then(onFulfilled, onRejected) {
    return this.result().then(onFulfilled, onRejected);
  }

  catch(onRejected) {
    return this.result().catch(onRejected);
  }

  finally(onFinally) {
    return this.result().finally(onFinally);
  }
}

/**
 * One command on the grid. Iterate it (`for await`) for its events as they come,
 * or await it for the result. Nothing is sent until you do either. Leaving the loop
 * early, cancel() or an aborted `signal` ends the request: an inference stops on the
 * tower; a training job keeps running (only the watching stops). After cancel() a
 * `for await` loop simply ends (no error), and awaiting the result rejects with a
 * GridError whose code is "cancelled"; your own aborted `signal` rejects as fetch
 * does (an AbortError).
 */
export class CommandRun extends Run {
  constructor(client, command, params, { signal } = {}) {
    super();
    this.command = command;
    this.params = params;
    this._client = client;
    this._abort = new AbortController();
    this._started = false;
    this._cancelled = false;
    this._ended = false;
    if (signal) {
      if (signal.aborted) this._abort.abort(signal.reason);
      else signal.addEventListener("abort", () => this._abort.abort(signal.reason), { once: true });
    }
  }

  /** Stop the command (see the class comment). */
  cancel() {
    this._cancelled = true;
    this._abort.abort();
  }

  async *[Symbol.asyncIterator]() {
    if (this._started) throw new Error(`${this.command}: a CommandRun can be read once`);
    this._started = true;
    let finished = false;
    try {
      const response = await this._client._post("/v1/grid/execute", { command: this.command, params: this.params },
        this._abort.signal);
      if (!response.ok) throw await errorFrom(response);
      for await (const event of ndjson(response.body)) {
        if (event.type === "error") {
          throw new GridError(event.code, event.message, { status: response.status, retryAfter: event.retry_after });
        }
        yield event;
      }
      finished = this._ended = true;
    } catch (error) {
      if (!this._cancelled) throw error;
      // cancel() aborted the request: the loop ends quietly (the abort is what was asked for)
    } finally {
      if (!finished) this._abort.abort(); // left early: close the connection so the gateway stops
    }
  }
}

/**
 * Commands over one WebSocket (/v1/grid/ws): several at once, each a SocketRun that
 * reads like a CommandRun (`for await`, await, cancel()). The socket opens on the
 * first execute(); with an API key, its first message is the key (a browser's
 * WebSocket cannot send an Authorization header). Needs a global WebSocket
 * (browsers, Node.js 22+; Node.js 20 with --experimental-websocket) or
 * `{ WebSocket }` given.
 */
export class GridSocket {
  constructor(client, { WebSocket: impl } = {}) {
    this._client = client;
    this._WebSocket = impl || globalThis.WebSocket;
    if (!this._WebSocket) throw new Error("no WebSocket here: use Node.js 22+ or pass { WebSocket }");
    this._runs = new Map();
    this._nextId = 1;
    this._opened = null;
    this._socket = null;
  }

  /** Run `command` with `params` on this socket; see SocketRun. */
  execute(command, params = {}) {
    return new SocketRun(this, String(this._nextId++), command, params);
  }

  /** Close the socket: the commands still running end (an inference stops on its tower). */
  close() {
    if (this._socket) this._socket.close(1000);
  }

  _open() {
    this._opened ||= new Promise((resolve, reject) => {
      const url = this._client.baseUrl.replace(/^http/, "ws") + "/v1/grid/ws";
      const socket = (this._socket = new this._WebSocket(url));
      socket.onopen = () => {
        if (this._client.apiKey) socket.send(JSON.stringify({ type: "auth", api_key: this._client.apiKey }));
        resolve(socket);
      };
      socket.onmessage = (message) => this._event(JSON.parse(message.data));
      socket.onerror = () => reject(new GridError("unreachable", `cannot open ${url}`));
      socket.onclose = (closed) => {
        const message = `the socket closed (${`${closed.code} ${closed.reason || ""}`.trim()})`;
        for (const run of this._runs.values()) run._push({ type: "error", code: "unreachable", message });
        this._runs.clear();
        this._opened = null;
        reject(new GridError("unreachable", message));
      };
    });
    return this._opened;
  }

  _event(event) {
    const run = this._runs.get(String(event.id));
    if (run) run._push(event);
    else if (event.type === "error" && event.id === null) {
      for (const each of this._runs.values()) each._push(event); // e.g. a refused key: nothing runs
    }
  }

  async _send(run) {
    this._runs.set(run.id, run);
    const socket = await this._open();
    socket.send(JSON.stringify({ id: run.id, command: run.command, params: run.params }));
  }

  _cancel(run) {
    if (this._socket && this._runs.has(run.id)) this._socket.send(JSON.stringify({ id: run.id, type: "cancel" }));
  }
}

/** One command on a GridSocket: iterate it for its events, or await it for the result. */
export class SocketRun extends Run {
  constructor(socket, id, command, params) {
    super();
    this.id = id;
    this.command = command;
    this.params = params;
    this._socket = socket;
    this._events = [];
    this._wake = null;
    this._started = false;
    this._cancelled = false;
    this._ended = false;
  }

  /** Stop the command on the tower; the loop then ends quietly. */
  cancel() {
    this._cancelled = true;
    this._socket._cancel(this);
  }

  _push(event) {
    this._events.push(event);
    if (this._wake) this._wake();
  }

  async *[Symbol.asyncIterator]() {
    if (this._started) throw new Error(`${this.command}: a SocketRun can be read once`);
    this._started = true;
    await this._socket._send(this);
    let finished = false;
    try {
      for (;;) {
        while (!this._events.length) await new Promise((resolve) => (this._wake = resolve));
        const event = this._events.shift();
        const { id, ...rest } = event;
        if (rest.type === "done") {
          this._ended = !rest.cancelled;
          break;
        }
        if (rest.type === "error") throw new GridError(rest.code, rest.message, { retryAfter: rest.retry_after });
        yield rest;
      }
      finished = true;
    } finally {
      if (!finished && !this._cancelled) this.cancel(); // left early: stop it on the tower
      this._socket._runs.delete(this.id);
    }
  }
}

/** A gateway (`rngrid serve`) to talk to. Defaults: RNGRID_URL, RNGRID_API_KEY. */
export class GridClient {
  constructor({ baseUrl, apiKey, fetch: fetchImpl } = {}) {
    this.baseUrl = (baseUrl || env("RNGRID_URL") || DEFAULT_URL).replace(/\/+$/, "");
    this.apiKey = apiKey ?? env("RNGRID_API_KEY") ?? null;
    this._fetch = fetchImpl || globalThis.fetch.bind(globalThis);
  }

  /** Run `command` with `params`; see CommandRun. */
  execute(command, params = {}, options = {}) {
    return new CommandRun(this, command, params, options);
  }

  /** A GridSocket on this gateway: many commands over one WebSocket. */
  socket(options = {}) {
    return new GridSocket(this, options);
  }

  /** The towers heard, with live load. */
  async towers() {
    return (await this._get("/v1/grid/towers")).towers;
  }

  /** Every model and adapter the grid serves (OpenAI's model list, plus `rngrid`). */
  async models() {
    return (await this._get("/v1/models")).data;
  }

  /** This identity's training jobs on every tower. */
  async jobs() {
    return (await this._get("/v1/grid/jobs")).jobs;
  }

  async health() {
    return this._get("/health");
  }

  _headers(extra = {}) {
    return this.apiKey ? { ...extra, Authorization: `Bearer ${this.apiKey}` } : extra;
  }

  _post(path, body, signal) {
    return this._fetch(this.baseUrl + path, {
      method: "POST", signal, body: JSON.stringify(body),
      headers: this._headers({ "Content-Type": "application/json", Accept: "application/x-ndjson" }),
    });
  }

  async _get(path) {
    const response = await this._fetch(this.baseUrl + path, { headers: this._headers() });
    if (!response.ok) throw await errorFrom(response);
    return response.json();
  }
}

let defaultClient = null;

/** `Commands.execute(command, params)` on a default client (RNGRID_URL / RNGRID_API_KEY, or configure()). */
export const Commands = {
  configure(options = {}) {
    defaultClient = new GridClient(options);
    return defaultClient;
  },
  get client() {
    defaultClient = defaultClient || new GridClient();
    return defaultClient;
  },
  execute(command, params = {}, options = {}) {
    return this.client.execute(command, params, options);
  },
};

export default Commands;
