"""OpenAI's chat and text completions on the grid: request checks and reply shapes.

``parse(body, chat, known_models)`` turns a ``POST /v1/chat/completions`` or
``/v1/completions`` body into an ``ai/inference`` payload for the Grid, or
raises ApiError(400) naming the field. What the grid cannot do (``n`` > 1,
tools, logprobs, images, penalties, JSON modes, ...) is refused rather than
silently ignored; fields that change nothing about the answer (``user``,
``metadata``, ...) are accepted. ``Reply`` builds the response objects and
stream chunks in OpenAI's shapes.
"""

import secrets
import time
from dataclasses import dataclass

from reticulum_grid.gateway.errors import bad_request

#: max_tokens null or absent: generate until the model stops or the context
#: window is full (the tower caps max_tokens at the room the prompt leaves).
UNTIL_CONTEXT_ENDS = 1 << 20
#: Fields passed to the tower as they are: llama.cpp-server-style sampling extras and ours.
EXTRAS = {"adapter", "adapter_scale", "top_k", "min_p", "repeat_penalty", "tower"}
#: Fields accepted and ignored: they do not change the answer.
IGNORED = {"user", "store", "metadata", "service_tier", "parallel_tool_calls"}
#: Fields the grid cannot honour, with the test for "asks for something": a
#: default value (False, 0, None, [] ...) is fine, anything else is a 400.
UNSUPPORTED = {
    "tools": bool, "tool_choice": lambda v: v not in (None, "none"), "functions": bool, "function_call": bool,
    "logprobs": bool, "top_logprobs": lambda v: v is not None, "logit_bias": bool,
    "presence_penalty": bool, "frequency_penalty": bool, "audio": bool, "prediction": bool,
    "modalities": lambda v: v not in (None, ["text"]), "web_search_options": bool, "reasoning_effort": bool,
    "response_format": lambda v: v not in (None, {"type": "text"}),
    "echo": bool, "best_of": lambda v: v not in (None, 1), "suffix": bool,
}
CHAT_ONLY = {"messages", "max_completion_tokens", "tools", "tool_choice", "functions", "function_call", "audio",
             "modalities", "prediction", "web_search_options", "reasoning_effort", "response_format", "top_logprobs"}
COMPLETION_ONLY = {"prompt", "echo", "best_of", "suffix"}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass
class Request:
    """A checked request: ``payload`` for Grid.execute("ai/inference"), the
    ``model`` name as asked, and the stream options."""
    payload: dict
    model: str
    stream: bool
    include_usage: bool
    tower: str | None


def parse(body, chat, known_models=()):
    """Check an OpenAI request body. ``known_models``: aliases the grid serves,
    to tell ``MODEL:ADAPTER`` from an alias that holds a colon. Raises ApiError(400)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    _check_fields(body, chat)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' must be a model name", "model")
    payload = {}
    base, adapter = split_model(model, known_models)
    if adapter and body.get("adapter") not in (None, adapter):
        raise bad_request(f"'model' names adapter {adapter!r} and 'adapter' names {body['adapter']!r}", "adapter")
    payload["model"] = base
    if chat:
        payload["messages"] = _messages(body.get("messages"))
    else:
        payload["prompt"] = _prompt(body.get("prompt"))
    if adapter:
        payload["adapter"] = adapter
    _sampling(body, payload, chat)
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
        if not isinstance(options, dict) or not set(options) <= {"include_usage", "include_obfuscation"}:
            raise bad_request("'stream_options' may hold only 'include_usage'", "stream_options")
    include_usage = bool(options and _flag(options, "include_usage", "stream_options.include_usage"))
    tower = payload.pop("tower", None)
    if tower is not None and not isinstance(tower, str):
        raise bad_request("'tower' must be a tower name or destination hash", "tower")
    return Request(payload, model, stream, include_usage, tower)


def split_model(name, known_models):
    """(model, adapter or None) from ``MODEL`` or ``MODEL:ADAPTER``."""
    if name in known_models or ":" not in name:
        return name, None
    for i, ch in enumerate(name):
        if ch == ":" and name[:i] in known_models:
            return name[:i], name[i + 1:] or None
    return name, None


def _check_fields(body, chat):
    other = COMPLETION_ONLY if chat else CHAT_ONLY
    allowed = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "seed", "stop", "n"} | EXTRAS | \
        IGNORED | set(UNSUPPORTED) | (CHAT_ONLY if chat else COMPLETION_ONLY)
    for name, value in body.items():
        if name not in allowed or name in other:
            raise bad_request(f"unrecognized request argument supplied: {name}", name)
        if name in UNSUPPORTED and UNSUPPORTED[name](value):
            raise bad_request(f"'{name}' is not supported by this grid (its models run on llama.cpp towers)", name,
                              code="unsupported")
    if body.get("n") not in (None, 1):
        raise bad_request("'n' must be 1: the grid generates one choice per request", "n", code="unsupported")


def _flag(body, name, param=None):
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise bad_request(f"'{param or name}' must be true or false", param or name)
    return bool(value)


def _number(body, name, lo, hi, integer=False):
    value = body.get(name)
    if value is None:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not lo <= value <= hi:
        kind = "an integer" if integer else "a number"
        raise bad_request(f"'{name}' must be {kind} in [{lo}, {hi}], got {value!r}", name)
    return value


def _sampling(body, payload, chat):
    limit = body.get("max_completion_tokens") if chat and body.get("max_completion_tokens") is not None else None
    name = "max_completion_tokens" if limit is not None else "max_tokens"
    payload["max_tokens"] = _number(body, name, 1, UNTIL_CONTEXT_ENDS, integer=True) or UNTIL_CONTEXT_ENDS
    for field, lo, hi, integer in (("temperature", 0, 2, False), ("top_p", 0, 1, False), ("top_k", 0, 100_000, True),
                                   ("min_p", 0, 1, False), ("repeat_penalty", 0, 10, False),
                                   ("adapter_scale", -10, 10, False)):
        value = _number(body, field, lo, hi, integer)
        if value is not None:
            payload[field] = value if integer else float(value)
    seed = _number(body, "seed", -(1 << 63), (1 << 64) - 1, integer=True)
    if seed is not None:
        payload["seed"] = seed & 0xFFFFFFFF  # llama.cpp seeds are 32-bit; the same seed still gives the same text
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or len(stop) > 16
                             or not all(isinstance(s, str) and 0 < len(s) <= 256 for s in stop)):
        raise bad_request("'stop' must be a string or a list of up to 16 non-empty strings", "stop")
    if stop:
        payload["stop"] = stop
    for field in ("adapter", "tower"):
        if body.get(field) is not None:
            if not isinstance(body[field], str) or not body[field]:
                raise bad_request(f"'{field}' must be a name", field)
            payload[field] = body[field]


def _messages(messages):
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", "messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(f"{where} must be an object", where)
        extra = set(message) - {"role", "content", "name"}
        if extra:
            raise bad_request(f"{where}.{sorted(extra)[0]} is not supported by this grid (no tool calls)",
                              f"{where}.{sorted(extra)[0]}", code="unsupported")
        role = ROLES.get(message.get("role"))
        if role is None:
            raise bad_request(f"{where}.role must be one of {', '.join(ROLES)} (no tool messages)", f"{where}.role")
        out.append({"role": role, "content": _content(message.get("content"), f"{where}.content")})
    return out


def _content(content, where):
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of text parts", where)
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise bad_request(f"{where}[{j}]: only text parts are supported (no images or audio)", f"{where}[{j}]",
                              code="unsupported")
        texts.append(part["text"])
    return "".join(texts)


def _prompt(prompt):
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad_request("'prompt' must be one string (token arrays and several prompts are not supported)",
                          "prompt")
    return prompt


class Reply:
    """OpenAI response objects for one request (chat or text completion)."""

    def __init__(self, chat, model):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())

    def _wrap(self, choices, streamed, **extra):
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if streamed and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, **extra}

    def chunk(self, text="", finish_reason=None, first=False):
        """One stream chunk with ``text`` (and the role on the ``first``)."""
        if self.chat:
            delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text or first else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self._wrap([choice], True)

    def usage_chunk(self, usage):
        """The extra last chunk of ``stream_options.include_usage``: no choices, the usage."""
        return self._wrap([], True, usage=usage_map(usage))

    def complete(self, text, usage):
        """The whole (non-streamed) response."""
        finish = finish_reason(usage)
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                      "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return self._wrap([choice], False, usage=usage_map(usage), rngrid=grid_usage(usage))


def finish_reason(usage):
    return usage.finish_reason if usage.finish_reason in ("stop", "length") else "stop"


def usage_map(usage):
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


def grid_usage(usage):
    """Where and how fast it ran: tower, TTFT (s), tokens/s, failovers."""
    return {"tower": usage.tower, "ttft_s": round(usage.ttft_s, 4), "tower_ttft_s": round(usage.tower_ttft_s, 4),
            "tokens_per_s": round(usage.tokens_per_s, 2), "failovers": usage.failovers}
