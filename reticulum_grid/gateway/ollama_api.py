"""Ollama's requests on the grid: chat, generate, embed, show and pull bodies, checked.

Each ``parse_*`` turns a body (Ollama's api/types.go shapes) into what the
Grid runs, or raises ApiError(400) naming the field, as the OpenAI side
does: what the grid cannot do (images, ``suffix``, ``template``,
``context``, ``think``, samplers the towers lack) is refused rather than
silently ignored. Options that only shape how a runner is loaded
(``num_ctx``, ``num_gpu``, ``num_thread``, ...) and ``keep_alive`` are
accepted and left to the towers' own ``[models.X]`` settings: a prompt the
tower's window cannot hold is an error, never a cut answer.

Names Ollama does not know are ignored, as Ollama ignores them (Go's JSON
decoding drops unknown fields of a request or message; ``Options.FromMap``
logs an unknown option and goes on) and its clients count on: the npm
``ollama-ai-provider-v2`` sends OpenAI's ``temperature``, ``top_p``,
``max_output_tokens`` and ``tool_choice`` beside Ollama's fields. The
gateway's log names what it ignored.

Model names: Ollama's ``MODEL:TAG``. ``:latest`` (what Ollama clients add)
is the model itself; another tag names a LoRA adapter on the model, as
``MODEL:ADAPTER`` does on the OpenAI side.
"""

import json
import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from reticulum_grid.gateway.errors import bad_request
from reticulum_grid.gateway.openai_api import UNTIL_CONTEXT_ENDS, ToolCall, messages as openai_messages, split_model

log = logging.getLogger("rngrid.gateway")

#: Sampling options and their ranges (Ollama's Options; the tower's request schema).
SAMPLING: dict[str, tuple[float, float, type[int] | type[float]]] = {
    "temperature": (0, 5, float), "top_p": (0, 1, float), "top_k": (0, 100_000, int), "min_p": (0, 1, float),
    "repeat_penalty": (0, 10, float), "presence_penalty": (-2, 2, float), "frequency_penalty": (-2, 2, float)}
#: Options that shape how a runner is loaded, not the answer: the tower's settings decide.
RUNNER_OPTIONS = {"num_ctx", "num_batch", "num_gpu", "main_gpu", "use_mmap", "use_mlock", "numa", "low_vram",
                  "vocab_only", "f16_kv", "logits_all", "num_thread", "embedding_only", "num_keep",
                  "penalize_newline", "draft_num_predict"}
#: Samplers the towers do not run, accepted only at the value that turns them off.
OFF = {"typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0, "repeat_last_n": 64}
OFF_WITH_MIROSTAT = ("mirostat_tau", "mirostat_eta")
KNOWN_OPTIONS = {*SAMPLING, *RUNNER_OPTIONS, *OFF, *OFF_WITH_MIROSTAT, "seed", "num_predict", "stop"}
CHAT_FIELDS = {"model", "messages", "stream", "format", "keep_alive", "tools", "options", "think", "logprobs",
               "top_logprobs", "truncate", "shift", "tower"}
GENERATE_FIELDS = {"model", "prompt", "suffix", "system", "template", "context", "stream", "raw", "format",
                   "keep_alive", "images", "options", "think", "logprobs", "top_logprobs", "truncate", "shift",
                   "tower", "width", "height", "steps"}
EMBED_FIELDS = {"model", "input", "prompt", "truncate", "options", "keep_alive", "dimensions", "tower"}
MESSAGE_FIELDS = {"role", "content", "images", "thinking", "tool_calls", "tool_name", "tool_call_id"}
PULL_FIELDS = {"model", "name", "insecure", "stream", "username", "password"}
SHOW_FIELDS = {"model", "name", "system", "template", "verbose", "options"}
#: How many ignored names a log line shows, and how much of each.
LOGGED_NAMES, LOGGED_NAME = 8, 40


@dataclass
class Request:
    """A checked chat or generate request: ``payload`` for Grid.execute("ai/inference")
    (None for Ollama's "load the model" request: no messages or prompt), the
    ``model`` as asked, ``stream`` (Ollama's default: true), ``top_logprobs``
    (None: no logprobs)."""
    payload: dict[str, Any] | None
    model: str
    stream: bool
    tower: str | None
    top_logprobs: int | None = None


@dataclass
class EmbedRequest:
    """``/api/embed`` or ``/api/embeddings``: texts, ``dimensions`` to keep (None: all);
    ``asked``: the model's name as asked (what the answer names)."""
    model: str
    texts: list[str]
    dimensions: int | None
    tower: str | None
    asked: str


def asked_name(body: dict[str, Any]) -> str:
    """Ollama's ``model`` (or the old ``name``) field as asked. Raises ApiError(400)."""
    name = body.get("model") if body.get("model") is not None else body.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request("'model' must be a model name", "model")
    return name


def model_name(body: dict[str, Any], known_models: Collection[str]) -> dict[str, str]:
    """{"model", "adapter"?} of Ollama's ``model`` (or the old ``name``) field. Raises ApiError(400)."""
    name = asked_name(body).removesuffix(":latest")
    base, adapter = split_model(name, known_models)
    return {"model": base} | ({"adapter": adapter} if adapter else {})


def checked_object(body: object, known: Collection[str], where: str = "the request body") -> dict[str, Any]:
    """``body`` when it is a JSON object; names outside ``known`` are logged and
    ignored (the module doc says why). Raises ApiError(400) for anything else."""
    if not isinstance(body, dict):
        raise bad_request(f"{where} must be a JSON object")
    _log_ignored(where, [name for name in body if name not in known])
    return body


def _log_ignored(where: str, names: list[Any]) -> None:
    """One log line naming the first few ``names`` ignored in ``where`` (escaped and cut: they come from the network)."""
    if names:
        shown = ", ".join(repr(str(name)[:LOGGED_NAME]) for name in names[:LOGGED_NAMES])
        more = f" and {len(names) - LOGGED_NAMES} more" if len(names) > LOGGED_NAMES else ""
        log.info("ignored in %s (not Ollama's): %s%s", where, shown, more)


def _refuse_if(body: dict[str, Any], name: str, why: str) -> None:
    if body.get(name):
        raise bad_request(f"'{name}' is not supported by this grid ({why})", name, code="unsupported")


def _common(body: dict[str, Any], payload: dict[str, Any],
            known_models: Collection[str]) -> tuple[bool, str | None, int | None]:
    """model, options, format, logprobs, think, tower and stream of a chat or generate body."""
    payload.update(model_name(body, known_models))
    _refuse_if(body, "think", "its towers do not separate a model's thinking from its answer")
    _options(body.get("options"), payload)
    payload.setdefault("max_tokens", UNTIL_CONTEXT_ENDS)  # Ollama's num_predict -1: until the model stops
    _format(body.get("format"), payload)
    top = None
    if body.get("logprobs") is not None and not isinstance(body["logprobs"], bool):
        raise bad_request("'logprobs' must be true or false", "logprobs")
    if body.get("logprobs"):
        top = body.get("top_logprobs") or 0
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
            raise bad_request("'top_logprobs' must be an integer in [0, 20]", "top_logprobs")
        payload.update(logprobs=True, top_logprobs=top)
    tower = body.get("tower")
    if tower is not None and (not isinstance(tower, str) or not tower):
        raise bad_request("'tower' must be a tower name or destination hash", "tower")
    stream = body.get("stream", True)
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("'stream' must be true or false", "stream")
    return stream is not False, tower, top


def _loading(body: dict[str, Any], model: str, stream: bool, tower: str | None, top: int | None) -> Request:
    """The Request of Ollama's "load the model" (no messages, no prompt); its
    unload form (``keep_alive`` 0) is refused: towers unload a model only when
    another needs the memory."""
    if body.get("keep_alive") in (0, "0", "0s", "0m"):
        raise bad_request("'keep_alive' 0 asks to unload the model; a tower unloads a model only when another "
                          "needs its memory", "keep_alive", code="unsupported")
    return Request(None, model, stream, tower, top)


def parse_chat(body: object, known_models: Collection[str] = ()) -> Request:
    """Check an ``/api/chat`` body. Raises ApiError(400)."""
    body = checked_object(body, CHAT_FIELDS)
    payload: dict[str, Any] = {}
    stream, tower, top = _common(body, payload, known_models)
    items = body.get("messages") or []
    if not isinstance(items, list):
        raise bad_request("'messages' must be a list", "messages")
    if not items:
        return _loading(body, asked_name(body), stream, tower, top)
    payload["messages"] = openai_messages(_messages(items))
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type", "function") == "function"
                                                  and isinstance(t.get("function"), dict) for t in tools):
            raise bad_request("'tools' must be a list of {'type': 'function', 'function': {...}}", "tools")
        payload["tools"] = [{"type": "function", "function": t["function"]} for t in tools]
    return Request(payload, asked_name(body), stream, tower, top)


def parse_generate(body: object, known_models: Collection[str] = ()) -> Request:
    """Check an ``/api/generate`` body. Raises ApiError(400)."""
    body = checked_object(body, GENERATE_FIELDS)
    for name, why in (("suffix", "no fill-in-the-middle"), ("template", "each model uses its own chat template"),
                      ("context", "no conversation state is kept between requests; use /api/chat"),
                      ("images", "text models only"), ("width", "no image generation"),
                      ("height", "no image generation"), ("steps", "no image generation")):
        _refuse_if(body, name, why)
    payload: dict[str, Any] = {}
    stream, tower, top = _common(body, payload, known_models)
    prompt, system = body.get("prompt") or "", body.get("system") or ""
    if not isinstance(prompt, str) or not isinstance(system, str):
        raise bad_request("'prompt' and 'system' must be strings", "prompt")
    model = asked_name(body)
    if not prompt and not system:
        return _loading(body, model, stream, tower, top)
    if body.get("raw"):
        if system:
            raise bad_request("'system' has no effect with 'raw' (the prompt goes to the model as it is)", "system")
        payload["prompt"] = prompt
    else:
        payload["messages"] = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": prompt}]
    return Request(payload, model, stream, tower, top)


def parse_embed(body: object, known_models: Collection[str] = (), legacy: bool = False) -> EmbedRequest:
    """Check an ``/api/embed`` body (``input``: a string or a list of them), or
    with ``legacy`` an ``/api/embeddings`` one (``prompt``: one string). Raises ApiError(400)."""
    body = checked_object(body, EMBED_FIELDS)
    name = model_name(body, known_models)
    if "adapter" in name:
        raise bad_request("embeddings come from a model without adapters", "model")
    field = "prompt" if legacy else "input"
    texts = body.get(field)
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts) \
            or (legacy and len(texts) != 1):
        raise bad_request(f"'{field}' must be a non-empty string" + ("" if legacy else " or a list of them"), field)
    _options(body.get("options"), {})
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise bad_request("'dimensions' must be a positive integer", "dimensions")
    tower = body.get("tower") if isinstance(body.get("tower"), str) and body.get("tower") else None
    return EmbedRequest(name["model"], texts, dimensions, tower, asked_name(body))


def _options(options: object, payload: dict[str, Any]) -> None:
    if options is None:
        return
    if not isinstance(options, dict):
        raise bad_request("'options' must be an object", "options")
    mirostat = options.get("mirostat") not in (None, 0)
    _log_ignored("options", [name for name in options if name not in KNOWN_OPTIONS])
    for name, value in options.items():
        where = f"options.{name}"
        if name in SAMPLING:
            lo, hi, kind = SAMPLING[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi \
                    or (kind is int and not isinstance(value, int)):
                raise bad_request(f"'{where}' must be a number in [{lo}, {hi}]", where)
            payload[name] = kind(value)
        elif name == "seed":
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad_request(f"'{where}' must be an integer", where)
            payload["seed"] = value & 0xFFFFFFFF
        elif name == "num_predict":
            if isinstance(value, bool) or not isinstance(value, int) or value == 0 or value < -2:
                raise bad_request(f"'{where}' must be a positive count, or -1 / -2 for no limit", where)
            payload["max_tokens"] = value if value > 0 else UNTIL_CONTEXT_ENDS
        elif name == "stop":
            stops = [value] if isinstance(value, str) else value
            if not isinstance(stops, list) or len(stops) > 16 or not all(isinstance(s, str) and s for s in stops):
                raise bad_request(f"'{where}' must be a list of up to 16 non-empty strings", where)
            if stops:
                payload["stop"] = stops
        elif name in OFF:
            if value != OFF[name]:
                raise bad_request(f"'{where}' is not supported by this grid (only {OFF[name]!r}, which turns it "
                                  "off)", where, code="unsupported")
        elif name in OFF_WITH_MIROSTAT:
            if mirostat:
                raise bad_request(f"'{where}' is not supported by this grid (no mirostat)", where, code="unsupported")


def _format(value: object, payload: dict[str, Any]) -> None:
    if value in (None, ""):
        return
    if value == "json":
        payload["response_format"] = {"type": "json_object"}
    elif isinstance(value, dict):
        payload["response_format"] = {"type": "json_schema", "json_schema": {"schema": value}}
    else:
        raise bad_request("'format' must be \"json\" or a JSON schema", "format")


def _messages(items: list[Any]) -> list[dict[str, Any]]:
    """Ollama chat messages in OpenAI's shape (openai_api.messages checks them
    after): tool calls with JSON-text arguments and ids, tool answers linked to them."""
    out: list[dict[str, Any]] = []
    open_calls: list[tuple[str, Any]] = []  # (id, name) of calls not answered yet
    for i, m in enumerate(items):
        where = f"messages[{i}]"
        checked_object(m, MESSAGE_FIELDS, where)
        if m.get("images"):
            raise bad_request(f"{where}.images is not supported by this grid (text models only)", f"{where}.images",
                              code="unsupported")
        role = m.get("role").lower() if isinstance(m.get("role"), str) else m.get("role")
        message = {"role": role, "content": m.get("content") or ""}
        if m.get("tool_calls"):
            message["tool_calls"] = _calls(m["tool_calls"], f"{where}.tool_calls", i)
            open_calls += [(c["id"], c["function"]["name"]) for c in message["tool_calls"]]
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:  # Ollama links a tool's answer by name
                named = [c for c in open_calls if c[1] == m.get("tool_name")] or open_calls
                call_id = named[0][0] if named else ""
            open_calls = [c for c in open_calls if c[0] != call_id]
            message["tool_call_id"] = call_id
        if isinstance(m.get("tool_name"), str) and m["tool_name"]:
            message["name"] = m["tool_name"]
        out.append(message)
    return out


def _calls(calls: object, where: str, i: int) -> list[ToolCall]:
    if not isinstance(calls, list):
        raise bad_request(f"{where} must be a list", where)
    out: list[ToolCall] = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{where}[{j}] must be {{'function': {{'name', 'arguments'}}}}", f"{where}[{j}]")
        arguments = fn.get("arguments") if fn.get("arguments") is not None else {}
        if not isinstance(arguments, (dict, str)):
            raise bad_request(f"{where}[{j}].function.arguments must be an object", f"{where}[{j}].function.arguments")
        call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else f"call_{i}_{j}"
        out.append({"id": call_id, "type": "function", "function": {
            "name": fn["name"], "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
    return out
