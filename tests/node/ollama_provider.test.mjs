// The npm ollama-ai-provider-v2 with Vercel's `ai` against a real `rngrid serve`, run by
// tests/gateway/test_gateway_ollama_clients.py with RNGRID_URL and RNGRID_MODEL set. The provider sends
// OpenAI's sampling fields (temperature, top_p, max_output_tokens) beside Ollama's and checks each
// reply against its own schema (an embed reply must carry load_duration). Packages: package.json here.
import assert from "node:assert/strict";
import { test } from "node:test";

import { embed, embedMany, generateText, streamText } from "ai";
import { createOllama } from "ollama-ai-provider-v2";

const ollama = createOllama({ baseURL: `${process.env.RNGRID_URL}/api` });
const model = process.env.RNGRID_MODEL;
// Ollama ignores max_output_tokens (not one of its fields): num_predict bounds the answer.
const bounded = { ollama: { options: { num_predict: 16 } } };

test("chat with temperature, top_p and max output tokens", async () => {
  const reply = await generateText({ model: ollama(model), prompt: "Name two planets.", temperature: 0, topP: 0.9,
                                     maxOutputTokens: 16, providerOptions: bounded });
  assert.ok(reply.text.trim().length > 0, JSON.stringify(reply.text));
  assert.ok(reply.usage.inputTokens > 0 && reply.usage.outputTokens > 0 && reply.usage.outputTokens <= 16,
            JSON.stringify(reply.usage));
  const body = reply.response.body;
  assert.ok(body.load_duration + body.prompt_eval_duration + body.eval_duration <= body.total_duration,
            JSON.stringify(body));
});

test("chat streamed", async () => {
  const result = streamText({ model: ollama(model), prompt: "Name two planets.", temperature: 0,
                             providerOptions: bounded });
  const pieces = [];
  for await (const piece of result.textStream) pieces.push(piece);
  assert.ok(pieces.length > 1 && pieces.join("").trim().length > 0, JSON.stringify(pieces));
  assert.ok((await result.usage).outputTokens > 0);
});

test("embed one text and many", async () => {
  const one = await embed({ model: ollama.embedding(model), value: "The sea is salty." });
  assert.equal(one.embedding.length, 576);
  const many = await embedMany({ model: ollama.embedding(model), values: ["The sea is salty.", "Tax forms are due."] });
  assert.equal(many.embeddings.length, 2);
  const same = one.embedding.reduce((sum, x, i) => sum + x * many.embeddings[0][i], 0);
  assert.ok(Math.abs(same - 1) < 1e-5, `cosine of the same text: ${same}`);  // unit vectors, one text
});
