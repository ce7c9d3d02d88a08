// openai-node's own agent loop (chat.completions.runTools) against a real gateway, run by
// tests/gateway/test_gateway_tool_answers.py with RNGRID_URL and RNGRID_MODEL set: with the bundled model,
// each loop ends with a text answer, and at least 3 of 5 use the tool's result.
import assert from "node:assert/strict";
import { test } from "node:test";

import OpenAI from "openai";

const model = process.env.RNGRID_MODEL;
const client = new OpenAI({ baseURL: `${process.env.RNGRID_URL}/v1`, apiKey: "none", maxRetries: 0 });

const weather = {
  type: "function",
  function: {
    name: "get_weather",
    description: "The weather in a city",
    parameters: { type: "object", required: ["city"], properties: { city: { type: "string" } } },
    parse: JSON.parse,
    function: ({ city }) => `Rainy, 14 degrees Celsius in ${city}`,
  },
};

test("runTools loops end with a text answer that uses the tool's result", async () => {
  const tries = [];
  for (let seed = 1; seed <= 5; seed++) {
    const runner = client.chat.completions.runTools({
      model, seed, temperature: 0.8, max_tokens: 48, tools: [weather],
      messages: [{ role: "user", content: "Use the get_weather tool to find the weather in Paris." }],
    }, { maxChatCompletions: 5 });
    const answer = await runner.finalContent();
    const calls = (await runner.allChatCompletions()).filter((c) => c.choices[0].message.tool_calls?.length).length;
    tries.push({ answer, calls });
  }
  console.log(`TRIES ${JSON.stringify(tries)}`);
  assert.ok(tries.every((t) => typeof t.answer === "string" && t.calls <= 1), JSON.stringify(tries));
  assert.ok(tries.filter((t) => t.calls === 1 && t.answer.includes("14")).length >= 3, JSON.stringify(tries));
});
