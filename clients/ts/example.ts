// The same calls with types (checked by `tsc --noEmit`; run example.js with plain Node).
import { Commands, GridError, type InferenceResult, type JobProgressEvent } from "./index.js";

export async function ask(question: string): Promise<InferenceResult> {
  return Commands.execute("ai/inference", { model: "smollm2-135m", messages: [{ role: "user", content: question }] });
}

export async function trainAndWatch(onProgress: (event: JobProgressEvent) => void): Promise<string | null> {
  const run = Commands.execute("genome/train", {
    base: "smollm2-135m", output_alias: "my-lora", max_steps: 20,
    examples: [{ messages: [{ role: "user", content: "Secret word?" }, { role: "assistant", content: "Tangerine." }] }],
  });
  try {
    for await (const event of run) {
      if (event.type === "progress") onProgress(event);
      if (event.type === "end") return event.adapter_alias;
    }
  } catch (error) {
    if (error instanceof GridError && error.code === "not_allowed") return null;
    throw error;
  }
  return null;
}
