// Types for @rngrid/client (index.js): the grid's commands through `rngrid serve`.

export type Role = "system" | "user" | "assistant" | "tool";
/** A call the model made, as it comes back in an assistant message (OpenAI's shape; arguments are JSON text). */
export interface MessageToolCall { id: string; type: "function"; function: { name: string; arguments: string } }
export interface Message {
  role: Role;
  content: string | null;
  /** An assistant message's calls (send them back with the history). */
  tool_calls?: MessageToolCall[];
  /** A tool message: the id of the call it answers. */
  tool_call_id?: string;
}
/** A function the model may call: its name, what it does and a JSON schema of its arguments. */
export interface Tool { type: "function"; function: { name: string; description?: string; parameters?: Record<string, unknown> } }
export type ToolChoice = "auto" | "none" | "required" | { type: "function"; function: { name: string } };
export type ResponseFormat =
  | { type: "text" }
  | { type: "json_object" }
  | { type: "json_schema"; json_schema: { name?: string; schema: Record<string, unknown> } };

/** ai/inference: give `messages` (chat, the model's own template) or `prompt` (raw text). */
export interface InferenceParams {
  /** Model alias (or blob id prefix of >= 8 hex digits). */
  model: string;
  messages?: Message[];
  prompt?: string;
  /** Tokens to generate at most (default 256; the tower caps it at the context window). */
  max_tokens?: number;
  temperature?: number;
  top_p?: number;
  top_k?: number;
  min_p?: number;
  repeat_penalty?: number;
  seed?: number;
  /** Up to 16 stop strings; the text stops before the first one. */
  stop?: string[];
  /** A GGUF LoRA adapter (alias or blob id), e.g. the output_alias of a training job. */
  adapter?: string;
  /** LoRA scale; 0 gives the base model. */
  adapter_scale?: number;
  /** -2..2, as OpenAI's. */
  presence_penalty?: number;
  frequency_penalty?: number;
  /** Functions the model may call (chat only); `tool_choice` naming one forces that call. */
  tools?: Tool[];
  tool_choice?: ToolChoice;
  /** Constrain the answer to JSON (any object, or one that a schema describes). */
  response_format?: ResponseFormat;
  /** Each token's log probability, with `top_logprobs` (0..20) alternatives. */
  logprobs?: boolean;
  top_logprobs?: number;
  /** Run on this tower (name or destination hash) instead of routing. */
  tower?: string;
}

/** ai/embeddings: one vector per text, from a model's runner (L2-normalised). */
export interface EmbeddingsParams { model: string; input: string | string[]; tower?: string }
export interface EmbeddingsResult { vectors: number[][]; dims: number; prompt_tokens: number; tower: string }
export type EmbeddingsEvent = { type: "embeddings" } & EmbeddingsResult;

/** Ends an inference. Tokens are counts, times seconds, rates tokens/s. */
export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  /** From the request to the first text, as the gateway measured it. */
  ttft_s: number;
  tokens_per_s: number;
  /** The tower that finished the answer. */
  tower: string;
  finish_reason: "stop" | "length" | "tool_calls" | string;
  tower_ttft_s: number;
  queued_s: number;
  /** Towers that died mid-stream and were replaced. */
  failovers: number;
  /** Prompt tokens the runner took from its cache; speculative decoding's proposed and held tokens. */
  cached_tokens: number;
  draft_tokens: number;
  draft_accepted: number;
  /** A split model's towers (destination hashes, the coordinator last); empty on one tower. */
  split: string[];
  /** The engine's own times reading the prompt and generating after it (llama.cpp's prompt_ms and predicted_ms, in seconds). */
  prompt_s: number;
  decode_s: number;
}

/** A token's log probability (<= 0), its UTF-8 bytes and the likeliest alternatives. */
export interface TokenLogprob { token: string; logprob: number; bytes: number[]; top: { token: string; logprob: number; bytes: number[] }[] }
export type TokenEvent = { type: "token"; text: string; logprobs?: TokenLogprob[] };
/** A piece of a tool call: `index` says which call; `id` and `name` come with its first piece, `arguments` is the next piece of its JSON. */
export type ToolCallEvent = { type: "tool_call"; index: number; id: string; name: string; arguments: string };
export type UsageEvent = { type: "usage" } & Usage;
export type InferenceEvent = TokenEvent | ToolCallEvent | UsageEvent;
/** The whole calls of an inference, each with its JSON arguments joined. */
export interface ToolCall { id: string; name: string; arguments: string }
export interface InferenceResult { text: string; usage: Usage; tool_calls: ToolCall[] }

export type JobState = "queued" | "running" | "succeeded" | "failed" | "cancelled";

/** A training job as its tower keeps it. Loss is the training loss; times are Unix seconds. */
export interface Job {
  id: string;
  tower: string;
  owner: string;
  state: JobState;
  step: number | null;
  total_steps: number | null;
  loss: number | null;
  lr: number | null;
  tokens_per_s: number | null;
  eta_s: number | null;
  final_loss: number | null;
  adapter_alias: string | null;
  adapter_blob: string | null;
  peft_blob: string | null;
  error: string | null;
  created: number;
  started: number | null;
  ended: number | null;
  notify: string | null;
}

export type JobStateEvent = { type: "state"; state: JobState; step?: number | null; total_steps?: number | null; loss?: number | null };
export type JobStartedEvent = { type: "started"; total_steps: number; resumed_from: number; device: string; examples: number; [key: string]: unknown };
export type JobProgressEvent = { type: "progress"; step: number; total_steps: number; loss: number; lr: number; tokens_per_s: number; eta_s: number };
export type JobEndEvent = {
  type: "end"; state: JobState; error: string | null; final_loss: number | null; duration_s: number;
  adapter_alias: string | null; adapter_blob: string | null; peft_blob: string | null; step: number | null; total_steps: number | null;
};
export type JobEvent = JobStateEvent | JobStartedEvent | JobProgressEvent | JobEndEvent;

/** A training example: a chat, or plain text. */
export type Example = { messages: Message[] } | { text: string };

/** genome/train: a LoRA fine-tuning job. Give the data as `examples`, `data` (JSONL text) or `dataset` (a blob on the tower). */
export interface TrainParams {
  base: string;
  output_alias: string;
  examples?: Example[];
  data?: string;
  dataset?: string;
  rank?: number;
  alpha?: number;
  dropout?: number;
  target_modules?: string[];
  learning_rate?: number;
  epochs?: number;
  max_steps?: number;
  seq_len?: number;
  batch_size?: number;
  seed?: number;
  checkpoint_every?: number;
  /** LXMF address for the result (default: the gateway's identity). */
  notify?: string;
  /** Tower name or hash; default: the one with the most free memory that lets us train. */
  tower?: string;
  /** Follow the job's events after it is accepted (default true). */
  watch?: boolean;
}
export type TrainEvent =
  | { type: "transfer"; done_bytes: number; total_bytes: number }
  | { type: "job"; job_id: string; tower: string }
  | JobEvent;
export interface TrainResult { job_id: string; tower: string; end: JobEndEvent | null }

export interface JobRef { job_id: string; tower?: string }

export interface Tower {
  name: string; destination: string; hops: number; age_s: number; backend: string; device: string;
  memory: { kind: "VRAM" | "RAM"; free_mib: number; total_mib: number };
  vram_free_mib: number; vram_total_mib: number; ram_free_mib: number; ram_total_mib: number;
  models: { alias: string; blob: string; loaded: boolean }[];
  adapters: { alias: string; blob: string }[];
  /** Voice engines: speech to text (stt) or text to speech (tts); realtime = seconds of audio per second of work. */
  voice: { alias: string; kind: "stt" | "tts"; language: string; realtime: number; free: number }[];
  load: { streams: number; queue: number; jobs: number };
  tokens_per_s: number; rtt_ms: number; backed_off: boolean;
}

export interface Model {
  id: string; object: "model"; created: number; owned_by: string;
  rngrid: { kind: "model" | "adapter"; blob: string; towers: { name: string; loaded: boolean }[] };
}

/** audio/transcribe: `audio` is the file (WAV, Ogg, FLAC, MP3, ...) as base64. */
export interface TranscribeParams { audio: string; model?: string; language?: string; prompt?: string; tower?: string }
export interface Segment { start_s: number; end_s: number; text: string }
export interface TranscriptEnd {
  language: string; language_probability: number; audio_s: number; work_s: number; realtime: number;
  queued_s: number; segments: number; model: string; tower: string; failovers: number;
}
export type TranscribeEvent = ({ type: "segment" } & Segment) | ({ type: "transcript"; text: string } & TranscriptEnd);
export interface TranscribeResult { text: string; segments: Segment[]; end: TranscriptEnd }
/** audio/speech: the text spoken into `format` (default wav). */
export type AudioFormat = "wav" | "pcm" | "opus" | "flac" | "mp3" | "aac";
export interface SpeechParams { text: string; model?: string; voice?: string; wpm?: number; format?: AudioFormat; tower?: string }
export interface SpeechEnd {
  format: string; sample_rate: number; audio_s: number; work_s: number; realtime: number; queued_s: number;
  voice: string; model: string; tower: string;
}
export type SpeechEvent = { type: "audio"; format: AudioFormat; data: string } | ({ type: "speech" } & SpeechEnd);
export interface SpeechResult { format: AudioFormat; audio: Uint8Array; end: SpeechEnd }

/** Every command: its params, the events it streams and what awaiting it gives. */
export interface CommandMap {
  "ai/inference": { params: InferenceParams; event: InferenceEvent; result: InferenceResult };
  "ai/embeddings": { params: EmbeddingsParams; event: EmbeddingsEvent; result: EmbeddingsResult };
  "genome/train": { params: TrainParams; event: TrainEvent; result: TrainResult };
  "audio/transcribe": { params: TranscribeParams; event: TranscribeEvent; result: TranscribeResult };
  "audio/speech": { params: SpeechParams; event: SpeechEvent; result: SpeechResult };
  "jobs/watch": { params: JobRef; event: JobEvent; result: JobEndEvent | null };
  "jobs/status": { params: Partial<JobRef>; event: { type: "jobs"; jobs: Job[] }; result: Job[] };
  "jobs/cancel": { params: JobRef; event: { type: "status"; job: Job }; result: Job };
  "caps/full": { params: { tower: string }; event: { type: "result"; reply: Record<string, unknown> }; result: Record<string, unknown> };
  "grid/towers": { params: Record<string, never>; event: { type: "towers"; towers: Tower[] }; result: Tower[] };
  "grid/models": { params: Record<string, never>; event: { type: "models"; models: Model[] }; result: Model[] };
}
export type CommandName = keyof CommandMap;
export type ParamsOf<C extends CommandName> = CommandMap[C]["params"];
export type EventOf<C extends CommandName> = CommandMap[C]["event"];
export type ResultOf<C extends CommandName> = CommandMap[C]["result"];

export interface ExecuteOptions {
  /** Aborting it ends the request, as cancel() does. */
  signal?: AbortSignal;
}

/** An error from the grid or the gateway. `code` is the grid's: busy, not_allowed, unknown_model, no_tower, ... */
export declare class GridError extends Error {
  constructor(code: string, message: string, options?: { status?: number | null; retryAfter?: number | null; param?: string | null });
  readonly code: string;
  /** HTTP status of the answer (200 for an error that came mid-stream). */
  readonly status: number | null;
  /** Seconds to wait before trying again (busy). */
  readonly retryAfter: number | null;
  /** The request field at fault, when one is. */
  readonly param: string | null;
}

/** What CommandRun and SocketRun share: iterate for the events, await for the result. */
export declare abstract class Run<C extends CommandName> implements AsyncIterable<EventOf<C>>, PromiseLike<ResultOf<C>> {
  readonly command: C;
  readonly params: ParamsOf<C>;
  cancel(): void;
  /** cancel() was called before the command's events ended. */
  readonly cancelled: boolean;
  [Symbol.asyncIterator](): AsyncIterator<EventOf<C>>;
  result(): Promise<ResultOf<C>>;
  /** ai/inference: just the text. */
  text(): Promise<string>;
  then<T = ResultOf<C>, E = never>(
    onFulfilled?: ((value: ResultOf<C>) => T | PromiseLike<T>) | null,
    onRejected?: ((reason: unknown) => E | PromiseLike<E>) | null,
  ): Promise<T | E>;
  catch<E = never>(onRejected?: ((reason: unknown) => E | PromiseLike<E>) | null): Promise<ResultOf<C> | E>;
  finally(onFinally?: (() => void) | null): Promise<ResultOf<C>>;
}

/**
 * One command on the grid: iterate it for its events as they come, or await it for
 * the result; nothing is sent before either. Leaving the loop early, cancel() or an
 * aborted signal ends the request: an inference stops on the tower; a training job
 * keeps running (only the watching stops). After cancel() a `for await` loop simply
 * ends, and awaiting the result rejects with GridError code "cancelled"; an aborted
 * signal of your own rejects as fetch does (AbortError). Read it once.
 */
export declare class CommandRun<C extends CommandName> extends Run<C> {}

/**
 * One command on a GridSocket: the same events, result and cancel() as a CommandRun
 * (cancel() stops an inference on its tower; the loop then ends quietly). Read it once.
 */
export declare class SocketRun<C extends CommandName> extends Run<C> {
  /** The command's id on its socket. */
  readonly id: string;
}

/**
 * Many commands over one WebSocket (/v1/grid/ws), opened on the first execute().
 * Needs a global WebSocket (browsers, Node.js 22+) or `{ WebSocket }` given.
 */
export declare class GridSocket {
  constructor(client: GridClient, options?: { WebSocket?: typeof WebSocket });
  execute<C extends CommandName>(command: C, params: ParamsOf<C>): SocketRun<C>;
  /** Close the socket; running commands end (an inference stops on its tower). */
  close(): void;
}

export interface ClientOptions {
  /** The gateway, e.g. "http://127.0.0.1:8080" (default: RNGRID_URL, else that). */
  baseUrl?: string;
  /** Sent as "Authorization: Bearer KEY" (default: RNGRID_API_KEY). */
  apiKey?: string | null;
  /** A fetch to use instead of the global one. */
  fetch?: typeof fetch;
}

export declare class GridClient {
  constructor(options?: ClientOptions);
  readonly baseUrl: string;
  readonly apiKey: string | null;
  execute<C extends CommandName>(command: C, params: ParamsOf<C>, options?: ExecuteOptions): CommandRun<C>;
  /** A GridSocket on this gateway: many commands over one WebSocket. */
  socket(options?: { WebSocket?: typeof WebSocket }): GridSocket;
  towers(): Promise<Tower[]>;
  models(): Promise<Model[]>;
  jobs(): Promise<Job[]>;
  health(): Promise<{ status: "ok"; identity: string; towers: number }>;
}

export declare const Commands: {
  /** Point the default client at a gateway. */
  configure(options?: ClientOptions): GridClient;
  readonly client: GridClient;
  execute<C extends CommandName>(command: C, params: ParamsOf<C>, options?: ExecuteOptions): CommandRun<C>;
};
export default Commands;
