// The JavaScript client's voice commands against a real gateway, run by tests/voice/test_voice_gateway.py
// with RNGRID_URL, RNGRID_AUDIO (a WAV file), RNGRID_EXPECT (the grid's own transcript of it)
// and RNGRID_TOWER set. Plain `node --test`, no packages.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { Commands } from "../../clients/ts/index.js";

const tower = process.env.RNGRID_TOWER;

test("audio/transcribe streams segments, then the transcript; awaiting gives {text, segments, end}", async () => {
  const audio = readFileSync(process.env.RNGRID_AUDIO).toString("base64");
  const events = [];
  for await (const event of Commands.execute("audio/transcribe", { audio, tower })) events.push(event);
  assert.ok(events.length >= 2);
  assert.deepEqual(events.slice(0, -1).map((e) => e.type), Array(events.length - 1).fill("segment"));
  assert.equal(events.at(-1).type, "transcript");
  const { text, segments, end } = await Commands.execute("audio/transcribe", { audio, tower });
  assert.equal(text, process.env.RNGRID_EXPECT);
  assert.equal(end.language, "en");
  assert.equal(end.tower, tower);
  assert.ok(segments.every((s) => s.start_s <= s.end_s));
});

test("audio/speech gives the audio bytes and the end figures", async () => {
  const { format, audio, end } = await Commands.execute("audio/speech", { text: "Good morning.", tower });
  assert.equal(format, "wav");
  assert.equal(new TextDecoder().decode(audio.slice(0, 4)), "RIFF");
  assert.ok(end.audio_s > 0.5 && end.sample_rate === 22050);
});
