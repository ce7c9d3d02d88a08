// Stream an answer from the grid, then show where it ran and how fast.
//
//   rngrid serve &                       # the gateway, on http://127.0.0.1:8080
//   node clients/ts/example.js "Why is the sky blue?"
//
// RNGRID_URL, RNGRID_API_KEY and RNGRID_MODEL (default smollm2-135m) say where and what.

import { Commands, GridError } from "./index.js";

const question = process.argv[2] || "Name three uses of a mesh network.";
const model = process.env.RNGRID_MODEL || "smollm2-135m";

try {
  const run = Commands.execute("ai/inference", {
    model,
    messages: [{ role: "user", content: question }],
    max_tokens: Number(process.env.RNGRID_MAX_TOKENS || 128),
    temperature: 0,
  });
  for await (const event of run) {
    if (event.type === "token") {
      process.stdout.write(event.text);
    } else {
      console.log(`\n\n${event.completion_tokens} tokens from ${event.tower}: ` +
        `first after ${(event.ttft_s * 1000).toFixed(0)} ms, ${event.tokens_per_s.toFixed(1)} tokens/s (${event.finish_reason})`);
    }
  }
} catch (error) {
  if (!(error instanceof GridError)) throw error;
  // A GridError's message starts with its code ("busy: every tower ..."): printed once.
  console.error(`grid error ${error.message}` + (error.retryAfter ? ` (retry in ${error.retryAfter} s)` : ""));
  process.exitCode = 1;
}
