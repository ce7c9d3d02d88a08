// The grid dashboard: polls the gateway's JSON (/v1/grid/towers, /v1/grid/jobs,
// /v1/models) and streams chat answers from /v1/chat/completions. No build step.
// Everything from the network is put into the page as text, never as HTML.

const POLL_MS = 1500;
const $ = (id) => document.getElementById(id);
let apiKey = localStorage.getItem("rngrid.key") || "";
const history = [];
let chatAbort = null;

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") node.className = v;
    else if (k === "style") Object.assign(node.style, v);
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function headers(extra = {}) {
  return apiKey ? { ...extra, Authorization: `Bearer ${apiKey}` } : extra;
}

async function api(path) {
  const response = await fetch(path, { headers: headers() });
  if (response.status === 401) {
    $("key-form").hidden = false;
    throw new Error("this gateway needs an API key");
  }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error ? body.error.message : `HTTP ${response.status}`);
  return body;
}

function setStatus(text, bad = false) {
  $("status").textContent = text;
  $("status").classList.toggle("bad", bad);
}

const mib = (n) => (n >= 10240 ? `${(n / 1024).toFixed(1)} GiB` : `${n} MiB`);

function renderTowers(towers) {
  $("tower-count").textContent = towers.length ? `(${towers.length})` : "";
  $("towers-empty").hidden = towers.length > 0;
  const rows = towers.map((t) => {
    const used = t.memory.total_mib ? 100 * (1 - t.memory.free_mib / t.memory.total_mib) : 0;
    return el("tr", { "data-tower": t.name },
      el("td", {}, el("div", { class: "name" }, t.name), el("div", { class: "hash" }, t.destination)),
      el("td", { class: "num" }, t.hops),
      el("td", { class: "num" }, `${Math.round(t.age_s)} s`),
      el("td", {}, t.backend, t.device ? el("div", { class: "hash" }, t.device) : null),
      el("td", {}, el("div", { class: "mem" },
        el("div", { class: "meter" }, el("div", { style: { width: `${used.toFixed(0)}%` } })),
        `${mib(t.memory.free_mib)} / ${mib(t.memory.total_mib)} ${t.memory.kind}`)),
      el("td", {}, t.models.map((m) => el("span", { class: m.loaded ? "tag loaded" : "tag", title: m.blob }, m.alias)),
        t.adapters.map((a) => el("span", { class: "tag adapter", title: a.blob }, a.alias)),
        (t.voice || []).map((v) => el("span", { class: "tag voice", "data-voice": v.kind,
          title: `${v.kind === "stt" ? "speech to text" : "text to speech"}, ${v.realtime}x real time` }, `${v.alias} (${v.kind})`))),
      el("td", {}, `${t.load.streams} running, ${t.load.queue} queued`, t.load.jobs ? el("div", { class: "hash" }, `${t.load.jobs} training`) : null),
      el("td", { class: "num" }, t.tokens_per_s ? t.tokens_per_s.toFixed(0) : "-"),
      el("td", { class: "num" }, `${t.rtt_ms.toFixed(0)} ms`));
  });
  $("towers").tBodies[0].replaceChildren(...rows);
}

function renderJobs(jobs) {
  $("jobs-empty").hidden = jobs.length > 0;
  $("jobs").replaceChildren(...jobs.map((j) => {
    const total = j.total_steps || 0;
    const step = j.step || 0;
    const done = j.state === "succeeded" ? 100 : total ? (100 * step) / total : 0;
    const info = [
      j.loss !== null && j.loss !== undefined ? `loss ${j.loss.toFixed(4)}` : null,
      j.tokens_per_s ? `${j.tokens_per_s.toFixed(0)} tok/s` : null,
      j.eta_s && j.state === "running" ? `ETA ${Math.round(j.eta_s)} s` : null,
      j.adapter_alias ? `adapter ${j.adapter_alias}` : null,
      j.error ? j.error : null,
    ].filter(Boolean).join(" · ");
    return el("div", { class: "job", "data-job": j.id, "data-step": step, "data-state": j.state },
      el("div", { class: "job-head" },
        el("span", {}, el("b", {}, j.id), ` on ${j.tower}`),
        el("span", { class: `job-state ${j.state}` }, `${j.state} · step ${step}/${total || "?"}`)),
      el("div", { class: "bar" }, el("div", { class: "fill", style: { width: `${done.toFixed(1)}%` } })),
      el("div", { class: "job-info" }, info));
  }));
}

function renderModels(models) {
  $("models").replaceChildren(...models.map((m) => el("li", { "data-model": m.id },
    el("span", { class: "kind" }, m.rngrid.kind),
    el("span", { class: "id" }, m.id),
    el("span", {}, m.rngrid.towers.map((t) => el("span", { class: t.loaded ? "tag loaded" : "tag" }, t.name))))));
  const select = $("chat-model");
  const chosen = select.value;
  const names = models.filter((m) => m.rngrid.kind === "model").map((m) => m.id);
  if (names.join() !== [...select.options].map((o) => o.value).join()) {
    select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    if (names.includes(chosen)) select.value = chosen;
  }
}

async function poll() {
  try {
    const [towers, jobs, models] = await Promise.all([api("/v1/grid/towers"), api("/v1/grid/jobs"), api("/v1/models")]);
    renderTowers(towers.towers);
    renderJobs(jobs.jobs);
    renderModels(models.data);
    setStatus(`live · ${towers.towers.length} tower${towers.towers.length === 1 ? "" : "s"} · ${new Date().toLocaleTimeString()}`);
  } catch (e) {
    setStatus(String(e.message || e), true);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

function addMessage(role, text) {
  const body = el("span", { class: "text" }, text);
  const node = el("div", { class: `msg ${role}` }, el("span", { class: "who" }, role), body);
  $("chat-log").append(node);
  $("chat-log").scrollTop = $("chat-log").scrollHeight;
  return body;
}

// Reads an SSE body: calls onData(json) for each `data:` event, onError(json) for `event: error`.
async function readSse(response, onData, onError) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = "message";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let nl;
    while ((nl = buffer.search(/\r?\n/)) >= 0) {
      const line = buffer.slice(0, nl);
      buffer = buffer.slice(nl + (buffer[nl] === "\r" ? 2 : 1));
      if (line === "") { event = "message"; continue; }
      if (line.startsWith("event:")) event = line.slice(6).trim();
      else if (line.startsWith("data:")) {
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        (event === "error" ? onError : onData)(JSON.parse(data));
      }
    }
  }
}

async function sendChat(text) {
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const out = addMessage("assistant", "");
  const started = performance.now();
  let firstAt = null;
  chatAbort = new AbortController();
  $("chat-send").disabled = true;
  $("chat-stop").disabled = false;
  $("chat-stats").textContent = "";
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", signal: chatAbort.signal,
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify({
        model: $("chat-model").value, messages: history, stream: true, stream_options: { include_usage: true },
        max_tokens: Number($("chat-max").value) || null, temperature: Number($("chat-temp").value),
      }),
    });
    if (!response.ok) {
      const body = await response.json();
      throw new Error(body.error ? `${body.error.code}: ${body.error.message}` : `HTTP ${response.status}`);
    }
    let usage = null;
    await readSse(response, (chunk) => {
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices.length ? chunk.choices[0].delta.content : "";
      if (delta) {
        firstAt = firstAt ?? performance.now();
        out.textContent += delta;
        $("chat-log").scrollTop = $("chat-log").scrollHeight;
      }
    }, (error) => { throw new Error(`${error.error.code}: ${error.error.message}`); });
    history.push({ role: "assistant", content: out.textContent });
    const seconds = (performance.now() - (firstAt ?? started)) / 1000;
    if (usage) {
      $("chat-stats").textContent = `${usage.completion_tokens} tokens · first token after ${((firstAt ?? started) - started).toFixed(0)} ms · `
        + `${(usage.completion_tokens / Math.max(seconds, 1e-3)).toFixed(1)} tokens/s`;
    }
  } catch (e) {
    if (e.name === "AbortError") {
      history.push({ role: "assistant", content: out.textContent });
      $("chat-stats").textContent = "stopped";
    } else {
      history.pop();
      out.parentElement.className = "msg error";
      out.textContent = String(e.message || e);
    }
  } finally {
    chatAbort = null;
    $("chat-send").disabled = false;
    $("chat-stop").disabled = true;
  }
}

function start() {
  $("chat-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("chat-input").value.trim();
    if (!text || chatAbort || !$("chat-model").value) return;
    $("chat-input").value = "";
    sendChat(text);
  });
  $("chat-input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("chat-form").requestSubmit(); }
  });
  $("chat-stop").addEventListener("click", () => chatAbort && chatAbort.abort());
  $("chat-clear").addEventListener("click", () => { history.length = 0; $("chat-log").replaceChildren(); $("chat-stats").textContent = ""; });
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    apiKey = $("key-input").value.trim();
    localStorage.setItem("rngrid.key", apiKey);
    $("key-form").hidden = true;
  });
  poll();
}

start();
