"""The ``ai/inference`` and ``ai/embeddings`` requests: schema and validation (tower side).

``ai/inference`` request map (msgpack)::

    {"model": str,                         # alias or blob id prefix (>= 8 hex)
     "prompt": str | "messages": [message, ...],
     "max_tokens": int = 256 (1..2^20; 0 only with continue_tokens), "temperature": float = 0.8, "top_p": float = 0.95,
     "top_k": int = 40, "min_p": float = 0.05, "repeat_penalty": float = 1.0,
     "presence_penalty": float = 0.0, "frequency_penalty": float = 0.0,   # -2..2, as OpenAI's
     "seed": int | None, "stop": [str, ...] | None,
     "adapter": str | None,                # GGUF LoRA alias or blob id on the tower
     "adapter_scale": float = 1.0,         # 0 gives the base model's output
     "tools": [{"type": "function", "function": {"name", "description"?, "parameters"?}}, ...] | None,
     "tool_choice": "auto" | "none" | "required" | {"type": "function", "function": {"name": str}} | None,
     "response_format": {"type": "text" | "json_object"} | {"type": "json_schema", "json_schema": {"schema": {...}}},
     "logprobs": bool = False, "top_logprobs": int = 0 (0..20),
     "speculative": bool = True,          # False: no speculative decoding, even with a draft model
     "continue_tokens": [int, ...] | None, # tokens another tower already generated (failover)
     "stream_id": int}                     # chosen by the client (random), unique per Link

A message is ``{"role": "system"|"user"|"assistant"|"tool", "content": str |
[{"type": "text", "text": str}, ...] | None}`` plus, for an assistant, its
``tool_calls`` ([{"id", "type": "function", "function": {"name", "arguments": str}}])
and, for a tool's answer, ``tool_call_id`` (OpenAI's shapes).

The same bytes sent again on a Link (a lost reply) get the first reply and
start nothing (tower/replies.py); another request with a stream id in use is
a bad_request.

Reply: ``{"ok": True, "stream_id": int, "queued": int}`` then Channel stream
messages (links/stream.py). Sampling defaults are llama-cpp-python's.

``ai/embeddings``: ``{"model": str, "input": str | [str, ...] (1..256 texts), "stream_id": int}``
(tower/inference.py says what comes back).
"""

import json
from dataclasses import dataclass
from typing import Any

from links.stream import MAX_STREAM_ID
from links.wire import Code, Field, WireError, in_range, max_len, validate

MAX_PROMPT_CHARS = 512 * 1024
MAX_MESSAGES = 512
MAX_TOOLS = 128
#: Bytes the tools, tool calls and a JSON schema of one request may take as JSON.
MAX_JSON_BYTES = 256 * 1024
MAX_EMBED_INPUTS = 256
ROLES = ("system", "user", "assistant", "tool")
TOOL_CHOICES = ("auto", "none", "required")

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
    "presence_penalty": Field(float, default=0.0, check=in_range(-2.0, 2.0)),
    "frequency_penalty": Field(float, default=0.0, check=in_range(-2.0, 2.0)),
    "seed": Field(int, check=in_range(0, (1 << 32) - 1)),
    "stop": Field(list, check=lambda v: None if len(v) <= 16 else "more than 16 stop strings"),
    "adapter": Field(str, check=max_len(128)),
    "adapter_scale": Field(float, default=1.0, check=in_range(-10.0, 10.0)),
    "tools": Field(list, check=lambda v: None if 0 < len(v) <= MAX_TOOLS else f"give 1..{MAX_TOOLS} tools"),
    "tool_choice": Field((str, dict)),
    "response_format": Field(dict),
    "logprobs": Field(bool, default=False),
    "top_logprobs": Field(int, default=0, check=in_range(0, 20)),
    "speculative": Field(bool, default=True),
    "continue_tokens": Field(list, check=lambda v: None if len(v) <= 1 << 20 else "too many tokens"),
    "stream_id": Field(int, required=True, check=in_range(0, MAX_STREAM_ID)),
}
EMBED_SCHEMA = {
    "model": Field(str, required=True, check=max_len(128)),
    "input": Field((str, list), required=True),
    "stream_id": Field(int, required=True, check=in_range(0, MAX_STREAM_ID)),
}


@dataclass
class Sampling:
    """Sampling options, with llama-cpp-python's create_completion defaults
    (what this grid always used); penalties as in OpenAI's API."""
    max_tokens: int = 256
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def to_runner(self) -> dict[str, Any]:
        body = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
                "repeat_penalty": self.repeat_penalty, "presence_penalty": self.presence_penalty,
                "frequency_penalty": self.frequency_penalty, "stop": list(self.stop)}
        if self.seed is not None:
            body["seed"] = self.seed
        return body


@dataclass
class InferenceRequest:
    model: str
    prompt: str | None
    messages: list[dict[str, Any]] | None
    sampling: Sampling
    stream_id: int
    adapter: str | None = None
    adapter_scale: float = 1.0
    continue_tokens: tuple[int, ...] = ()
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    json_schema: dict[str, Any] | None = None  # response_format as a JSON schema ({} for any JSON object)
    logprobs: int = 0  # top alternatives per token; 0 without logprobs
    speculative: bool = True

    @property
    def continuable(self) -> bool:
        """Whether another tower may continue this stream from its tokens (no
        stop strings, whose held-back text blurs the token boundary; no tools)."""
        return not self.sampling.stop and not self.tools


def parse(request: dict[str, Any]) -> InferenceRequest:
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
                        presence_penalty=r["presence_penalty"], frequency_penalty=r["frequency_penalty"],
                        seed=r["seed"], stop=stop)
    continued = tuple(r["continue_tokens"] or ())
    if r["max_tokens"] == 0 and not continued:
        # 0 is for a stream whose tower died after its last token: the
        # continuation ends it at once and counts the prompt.
        raise WireError(Code.BAD_REQUEST, "field 'max_tokens': outside 1..1048576 (0 only with continue_tokens)")
    if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < 1 << 31 for t in continued):
        raise WireError(Code.BAD_REQUEST, "continue_tokens must be token ids")
    tools, choice = _tools(r["tools"], r["tool_choice"])
    if tools and r["messages"] is None:
        raise WireError(Code.BAD_REQUEST, "field 'tools' needs 'messages' (a chat)")
    if tools and continued:
        raise WireError(Code.BAD_REQUEST, "a request with tools cannot be continued from tokens")
    return InferenceRequest(r["model"], r["prompt"], r["messages"], sampling, r["stream_id"], r["adapter"],
                            r["adapter_scale"], continued, tools, choice, _response_format(r["response_format"]),
                            (r["top_logprobs"] or 1) if r["logprobs"] else 0, r["speculative"])


def parse_embeddings(request: dict[str, Any]) -> tuple[str, list[str], int]:
    """(model, [text, ...], stream id) of an ai/embeddings request. Raises WireError(bad_request)."""
    r = validate(request, EMBED_SCHEMA)
    texts = [r["input"]] if isinstance(r["input"], str) else r["input"]
    if not 0 < len(texts) <= MAX_EMBED_INPUTS:
        raise WireError(Code.BAD_REQUEST, f"field 'input': give 1..{MAX_EMBED_INPUTS} texts")
    if any(not isinstance(t, str) or not t for t in texts) or sum(map(len, texts)) > MAX_PROMPT_CHARS:
        raise WireError(Code.BAD_REQUEST, "field 'input' must hold non-empty strings, "
                                          f"{MAX_PROMPT_CHARS} characters in all at most")
    return r["model"], texts, r["stream_id"]


def _json_size(value: object, field: str) -> None:
    try:
        size = len(json.dumps(value))
    except (TypeError, ValueError):
        raise WireError(Code.BAD_REQUEST, f"field {field!r} is not JSON") from None
    if size > MAX_JSON_BYTES:
        raise WireError(Code.BAD_REQUEST, f"field {field!r} is {size} bytes of JSON, limit {MAX_JSON_BYTES}")


def _tools(tools: list[Any] | None,
           choice: str | dict[str, Any] | None) -> tuple[list[dict[str, Any]] | None, str | dict[str, Any] | None]:
    """(tools or None, tool_choice or None); "none" drops the tools."""
    if choice is not None and tools is None:
        raise WireError(Code.BAD_REQUEST, "field 'tool_choice' needs 'tools'")
    if tools is None:
        return None, None
    _json_size(tools, "tools")
    names: list[str] = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not 0 < len(fn["name"]) <= 64:
            raise WireError(Code.BAD_REQUEST, f"tools[{i}] must be {{'type': 'function', 'function': {{'name': "
                                              "1..64 characters, 'description'?, 'parameters'?}}")
        if not isinstance(fn.get("parameters", {}), dict) or not isinstance(fn.get("description", ""), str):
            raise WireError(Code.BAD_REQUEST, f"tools[{i}].function: 'parameters' must be a JSON schema (a map), "
                                              "'description' a string")
        names.append(fn["name"])
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise WireError(Code.BAD_REQUEST, f"field 'tool_choice' must be one of {', '.join(TOOL_CHOICES)} "
                                              "or {'type': 'function', 'function': {'name': ...}}")
        if choice == "none":
            return None, None
    elif isinstance(choice, dict):
        fn = choice.get("function")
        if choice.get("type") != "function" or not isinstance(fn, dict) or fn.get("name") not in names:
            raise WireError(Code.BAD_REQUEST, "field 'tool_choice' names no function of 'tools'")
    return tools, choice


def _response_format(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """The JSON schema a response_format asks for ({} for any JSON object), or None."""
    if value is None or value.get("type") == "text":
        return None
    kind = value.get("type")
    if kind == "json_object":
        return {}
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise WireError(Code.BAD_REQUEST, "field 'response_format': json_schema needs {'schema': {...}}")
        _json_size(schema, "response_format")
        return schema
    raise WireError(Code.BAD_REQUEST, "field 'response_format': type must be text, json_object or json_schema")


def _check_messages(messages: list[Any]) -> None:
    total = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not {"role", "content"} <= set(m) <= {"role", "content", "tool_calls",
                                                                          "tool_call_id", "name"}:
            raise WireError(Code.BAD_REQUEST, f"messages[{i}] must be a map with 'role' and 'content' "
                                              "(and, in tool use, 'tool_calls', 'tool_call_id' or 'name')")
        if m["role"] not in ROLES:
            raise WireError(Code.BAD_REQUEST, f"messages[{i}].role must be one of {', '.join(ROLES)}")
        total += _content_chars(m["content"], i, m)
        if "tool_calls" in m:
            _check_calls(m["tool_calls"], i, m["role"])
        for key in ("tool_call_id", "name"):
            if key in m and (not isinstance(m[key], str) or len(m[key]) > 256):
                raise WireError(Code.BAD_REQUEST, f"messages[{i}].{key} must be a string of up to 256 characters")
    if total > MAX_PROMPT_CHARS:
        raise WireError(Code.BAD_REQUEST, "messages too long")


def _content_chars(content: object, i: int, message: dict[str, Any]) -> int:
    if isinstance(content, str):
        return len(content)
    if content is None and message["role"] == "assistant" and message.get("tool_calls"):
        return 0
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) and set(p) == {"type", "text"}
                                         for p in content):
        return sum(len(p["text"]) for p in content)
    raise WireError(Code.BAD_REQUEST, f"messages[{i}].content must be a string or a list of "
                                      "{'type': 'text', 'text': str} parts (null only beside tool_calls)")


def _check_calls(calls: object, i: int, role: str) -> None:
    if role != "assistant" or not isinstance(calls, list) or len(calls) > MAX_TOOLS:
        raise WireError(Code.BAD_REQUEST, f"messages[{i}].tool_calls belongs to an assistant message, as a list")
    _json_size(calls, "tool_calls")
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or \
                not isinstance(fn.get("arguments"), str) or not isinstance(call.get("id", ""), str):
            raise WireError(Code.BAD_REQUEST, f"messages[{i}].tool_calls: each needs 'id' and 'function': "
                                              "{'name': str, 'arguments': str (JSON)}")
