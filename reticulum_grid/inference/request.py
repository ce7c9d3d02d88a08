"""The ``ai/inference`` request: schema and validation (tower side).

Request map (msgpack)::

    {"model": str,                         # alias or blob id prefix (>= 8 hex)
     "prompt": str | "messages": [{"role": "system"|"user"|"assistant", "content": str}, ...],
     "max_tokens": int = 256 (1..2^20; 0 only with continue_tokens), "temperature": float = 0.8, "top_p": float = 0.95,
     "top_k": int = 40, "min_p": float = 0.05, "repeat_penalty": float = 1.0,
     "seed": int | None, "stop": [str, ...] | None,
     "adapter": str | None,                # GGUF LoRA alias or blob id on the tower
     "adapter_scale": float = 1.0,         # 0 gives the base model's output
     "continue_tokens": [int, ...] | None, # tokens another tower already generated (failover)
     "stream_id": int}                     # chosen by the client (random), unique per Link

The same bytes sent again on a Link (a lost reply) get the first reply and
start nothing (tower/replies.py); another request with a stream id in use is
a bad_request.

Reply: ``{"ok": True, "stream_id": int, "queued": int}`` then Channel stream
messages (links/stream.py). Sampling defaults are llama-cpp-python's.
"""

from dataclasses import dataclass

from links.stream import MAX_STREAM_ID
from links.wire import Code, Field, WireError, in_range, max_len, validate
from reticulum_grid.inference.llama_backend import Sampling

MAX_PROMPT_CHARS = 512 * 1024
MAX_MESSAGES = 512
ROLES = ("system", "user", "assistant")

SCHEMA = {
    "model": Field(str, required=True, check=max_len(128)),
    "prompt": Field(str, check=lambda v: None if len(v) <= MAX_PROMPT_CHARS else "prompt too long"),
    "messages": Field(list, check=max_len(MAX_MESSAGES)),
    "max_tokens": Field(int, default=256, check=in_range(0, 1 << 20)),
    "temperature": Field(float, default=0.8, check=in_range(0.0, 5.0)),
    "top_p": Field(float, default=0.95, check=in_range(0.0, 1.0)),
    "top_k": Field(int, default=40, check=in_range(0, 100_000)),
    "min_p": Field(float, default=0.05, check=in_range(0.0, 1.0)),
    "repeat_penalty": Field(float, default=1.0, check=in_range(0.0, 10.0)),
    "seed": Field(int, check=in_range(0, (1 << 32) - 1)),
    "stop": Field(list, check=lambda v: None if len(v) <= 16 else "more than 16 stop strings"),
    "adapter": Field(str, check=max_len(128)),
    "adapter_scale": Field(float, default=1.0, check=in_range(-10.0, 10.0)),
    "continue_tokens": Field(list, check=lambda v: None if len(v) <= 1 << 20 else "too many tokens"),
    "stream_id": Field(int, required=True, check=in_range(0, MAX_STREAM_ID)),
}


@dataclass
class InferenceRequest:
    model: str
    prompt: str | None
    messages: list | None
    sampling: Sampling
    stream_id: int
    adapter: str | None = None
    adapter_scale: float = 1.0
    continue_tokens: tuple = ()


def parse(request):
    """Validate an unpacked request map. Raises WireError(bad_request)."""
    r = validate(request, SCHEMA)
    if (r["prompt"] is None) == (r["messages"] is None):
        raise WireError(Code.BAD_REQUEST, "give exactly one of 'prompt' or 'messages'")
    if r["messages"] is not None:
        _check_messages(r["messages"])
    stop = tuple(r["stop"] or ())
    if any(not isinstance(s, str) or not 0 < len(s) <= 256 for s in stop):
        raise WireError(Code.BAD_REQUEST, "field 'stop' must hold strings of 1..256 characters")
    sampling = Sampling(max_tokens=r["max_tokens"], temperature=r["temperature"], top_p=r["top_p"],
                        top_k=r["top_k"], min_p=r["min_p"], repeat_penalty=r["repeat_penalty"],
                        seed=r["seed"], stop=stop)
    continued = tuple(r["continue_tokens"] or ())
    if r["max_tokens"] == 0 and not continued:
        # 0 is for a stream whose tower died after its last token: the
        # continuation only finishes a character those tokens began, and ends.
        raise WireError(Code.BAD_REQUEST, "field 'max_tokens': outside 1..1048576 (0 only with continue_tokens)")
    if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < 1 << 31 for t in continued):
        raise WireError(Code.BAD_REQUEST, "continue_tokens must be token ids")
    return InferenceRequest(r["model"], r["prompt"], r["messages"], sampling, r["stream_id"], r["adapter"],
                            r["adapter_scale"], continued)


def _check_messages(messages):
    total = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            raise WireError(Code.BAD_REQUEST, f"messages[{i}] must be a map with exactly 'role' and 'content'")
        if m["role"] not in ROLES:
            raise WireError(Code.BAD_REQUEST, f"messages[{i}].role must be one of {', '.join(ROLES)}")
        if not isinstance(m["content"], str):
            raise WireError(Code.BAD_REQUEST, f"messages[{i}].content must be a string")
        total += len(m["content"])
    if total > MAX_PROMPT_CHARS:
        raise WireError(Code.BAD_REQUEST, "messages too long")
