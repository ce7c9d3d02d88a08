// The JavaScript client's GridSocket (clients/ts) against a real gateway with an API key, run by
// tests/gateway/test_gateway_websocket.py with RNGRID_URL, RNGRID_API_KEY, RNGRID_MODEL and RNGRID_TOWER set.
// Plain `node --test`, no packages (Node.js 20 needs --experimental-websocket).
import assert from "node:assert/strict";
import { test } from "node:test";

import { GridClient, GridError } from "../../clients/ts/index.js";

const model = process.env.RNGRID_MODEL;
const tower = process.env.RNGRID_TOWER;
const COUNT = "Count from 1 to 500, separated by commas: 1, 2, 3,";

test("two commands at once on one socket, with the key as its first message", async () => {
  const socket = new GridClient().socket();
  try {
    const [a, b] = await Promise.all([
      socket.execute("ai/inference", { model, prompt: COUNT, max_tokens: 16, temperature: 0 }),
      socket.execute("ai/inference", { model, prompt: COUNT, max_tokens: 8, temperature: 0 }),
    ]);
    assert.equal(a.usage.completion_tokens, 16);
    assert.equal(b.usage.completion_tokens, 8);
    assert.equal(a.usage.tower, tower);
    assert.ok(a.text.length > 0 && b.text.length > 0);
    await assert.rejects(socket.execute("ai/inference", { model: "no-such-model", prompt: "hi" }).result(),
      (error) => error instanceof GridError && error.code === "unknown_model");
  } finally {
    socket.close();
  }
});

test("cancel() stops one command; the other goes on", async () => {
  const socket = new GridClient().socket();
  try {
    const long = socket.execute("ai/inference", { model, prompt: COUNT, max_tokens: 2000, temperature: 0 });
    const short = socket.execute("ai/inference", { model, prompt: COUNT, max_tokens: 8, temperature: 0 });
    const shortDone = short.result();
    let tokens = 0;
    for await (const event of long) {
      if (event.type === "token" && ++tokens === 3) long.cancel();
    }
    assert.ok(tokens >= 3 && long.cancelled);
    assert.equal((await shortDone).usage.completion_tokens, 8);
    console.log("CANCELLED");
  } finally {
    socket.close();
  }
});

test("a wrong key is refused before any command runs", async () => {
  const socket = new GridClient({ apiKey: "wrong" }).socket();
  await assert.rejects(socket.execute("ai/inference", { model, prompt: COUNT, max_tokens: 8 }).result(),
    (error) => error instanceof GridError && error.code === "invalid_api_key");
  socket.close();
});
