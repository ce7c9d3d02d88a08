// The JavaScript client (clients/ts) against a real gateway, run by tests/gateway/test_gateway_clients.py
// with RNGRID_URL, RNGRID_MODEL and RNGRID_TOWER set, in phases (RNGRID_PHASE): "inference";
// "train" (starts a job, prints "JOB <id>" and leaves it running for the dashboard test);
// "cancel" (cancels RNGRID_JOB). Plain `node --test`, no packages.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Commands, GridClient, GridError } from "../../clients/ts/index.js";

const model = process.env.RNGRID_MODEL;
const tower = process.env.RNGRID_TOWER;
const phase = process.env.RNGRID_PHASE || "inference";
const COUNT = "Count from 1 to 500, separated by commas: 1, 2, 3,";

async function idle(client, seconds) {
  const deadline = Date.now() + seconds * 1000;
  while (Date.now() < deadline) {
    const row = (await client.towers()).find((t) => t.name === tower);
    if (row && row.load.streams === 0 && row.load.queue === 0) return true;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return false;
}

test("ai/inference streams tokens, then usage; awaiting gives {text, usage}", { skip: phase !== "inference" }, async () => {
  const events = [];
  for await (const event of Commands.execute("ai/inference", { model, prompt: COUNT, max_tokens: 12, temperature: 0 })) {
    events.push(event);
  }
  assert.ok(events.length >= 3);
  assert.deepEqual(events.slice(0, -1).map((e) => e.type), Array(events.length - 1).fill("token"));
  const usage = events.at(-1);
  assert.equal(usage.type, "usage");
  assert.equal(usage.completion_tokens, 12);
  assert.equal(usage.tower, tower);
  const { text, usage: again } = await Commands.execute("ai/inference", { model, prompt: COUNT, max_tokens: 12, temperature: 0 });
  assert.equal(text, events.slice(0, -1).map((e) => e.text).join(""));
  assert.equal(again.finish_reason, "length");
  assert.match(text, /4, 5/);
});

test("grid errors arrive as GridError with the grid's code", { skip: phase !== "inference" }, async () => {
  await assert.rejects(Commands.execute("ai/inference", { model: "no-such-model", prompt: "hi" }).result(),
    (error) => error instanceof GridError && error.code === "unknown_model" && error.status === 404);
  await assert.rejects(Commands.execute("ai/inference", { model, prompt: "hi", temperature: 99 }).text(),
    (error) => error instanceof GridError && error.code === "bad_request" && /temperature/.test(error.message));
  await assert.rejects(Commands.execute("jobs/watch", { job_id: "nope" }).result(),
    (error) => error instanceof GridError && error.code === "unknown_job");
});

test("leaving the loop early stops the generation on the tower", { skip: phase !== "inference" }, async () => {
  const client = new GridClient();
  let n = 0;
  for await (const event of client.execute("ai/inference", { model, prompt: COUNT, max_tokens: 2000, temperature: 0 })) {
    if (event.type === "token" && ++n === 3) break;
  }
  assert.ok(await idle(client, 3), "the tower kept generating");
  const controller = new AbortController();
  const run = client.execute("ai/inference", { model, prompt: COUNT, max_tokens: 2000 }, { signal: controller.signal });
  setTimeout(() => controller.abort(), 300);
  await assert.rejects(run.result(), (error) => error.name === "AbortError");
  assert.ok(await idle(client, 3), "the tower kept generating after abort");
});

test("cancel() mid-loop ends the loop quietly; awaiting a cancelled run is GridError cancelled", { skip: phase !== "inference" }, async () => {
  const client = new GridClient();
  const run = client.execute("ai/inference", { model, prompt: COUNT, max_tokens: 2000, temperature: 0 });
  let tokens = 0;
  for await (const event of run) {
    if (event.type === "token" && ++tokens === 3) run.cancel(); // no DOMException comes out of the loop
  }
  assert.ok(tokens >= 3 && run.cancelled);
  assert.ok(await idle(client, 3), "the tower kept generating after cancel()");
  const awaited = client.execute("ai/inference", { model, prompt: COUNT, max_tokens: 2000 });
  setTimeout(() => awaited.cancel(), 300);
  await assert.rejects(awaited.result(), (error) => error instanceof GridError && error.code === "cancelled");
  assert.ok(await idle(client, 3), "the tower kept generating after cancel()");
});

test("tool calls and embeddings through the command API", { skip: phase !== "inference" }, async () => {
  const tools = [{ type: "function", function: { name: "get_weather", description: "The weather in a city",
    parameters: { type: "object", required: ["city"], properties: { city: { type: "string" } } } } }];
  const { tool_calls: calls, usage } = await Commands.execute("ai/inference", {
    model, messages: [{ role: "user", content: "Weather in Paris?" }], tools, max_tokens: 60, temperature: 0,
    tool_choice: { type: "function", function: { name: "get_weather" } },
  });
  assert.equal(usage.finish_reason, "tool_calls");
  assert.equal(calls.length, 1);
  assert.equal(calls[0].name, "get_weather");
  assert.equal(typeof JSON.parse(calls[0].arguments).city, "string");
  const embedded = await Commands.execute("ai/embeddings", { model, input: ["The sea.", "The sea."] });
  assert.equal(embedded.vectors.length, 2);
  assert.equal(embedded.vectors[0].length, embedded.dims);
});

test("genome/train starts a job and is watched until its first progress", { skip: phase !== "train" }, async () => {
  const examples = Array.from({ length: 8 }, (_, i) => ({
    messages: [{ role: "user", content: `What is the secret number ${i}?` }, { role: "assistant", content: "It is 42." }],
  }));
  let job = null;
  let progress = null;
  for await (const event of Commands.execute("genome/train", {
    base: model, output_alias: "node-lora", examples, max_steps: 200, seq_len: 32, batch_size: 1,
    target_modules: ["q_proj", "v_proj"], tower,
  })) {
    if (event.type === "job") job = event;
    if (event.type === "progress") { progress = event; break; } // stop watching; the job keeps running
  }
  assert.ok(job && job.job_id && job.tower === tower);
  assert.ok(progress.step >= 1 && progress.total_steps === 200 && progress.loss > 0);
  const [status] = await Commands.execute("jobs/status", { job_id: job.job_id });
  assert.equal(status.state, "running");
  console.log(`JOB ${job.job_id}`);
});

test("jobs/cancel cancels it; jobs/watch sees it end", { skip: phase !== "cancel" }, async () => {
  const jobId = process.env.RNGRID_JOB;
  const cancelled = await Commands.execute("jobs/cancel", { job_id: jobId });
  assert.equal(cancelled.id, jobId);
  const end = await Commands.execute("jobs/watch", { job_id: jobId });
  assert.equal(end.type, "end");
  assert.equal(end.state, "cancelled");
  const listed = (await new GridClient().jobs()).find((j) => j.id === jobId);
  assert.equal(listed.state, "cancelled");
});
