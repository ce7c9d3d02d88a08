"""OpenAI's requests on the grid: chat and text completions, embeddings.

``parse(body, chat, known_models)`` turns a ``POST /v1/chat/completions`` or
``/v1/completions`` body into an ``ai/inference`` payload for the Grid
(inference/request.py has its schema); ``parse_embeddings`` does the same
for ``POST /v1/embeddings``. Each raises ApiError(400) naming the field.
Tools (``tools``, ``tool_choice``, tool-role messages, assistant
``tool_calls``), ``response_format`` (json_object, json_schema),
``logprobs``/``top_logprobs`` (the completions API's ``logprobs`` count too)
and the penalties go to the tower. What the grid cannot do (``n`` > 1,
images, audio, ``logit_bias``, the legacy ``functions``, ...) is refused
rather than silently ignored; fields that change nothing about the answer
(``user``, ``metadata``, ...) are accepted. Reply shapes: openai_reply.py.
"""

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict, TypeVar

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
UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "functions": bool, "function_call": bool, "logit_bias": bool, "audio": bool, "prediction": bool,
    "modalities": lambda v: v not in (None, ["text"]), "web_search_options": bool, "reasoning_effort": bool,
    "echo": bool, "best_of": lambda v: v not in (None, 1), "suffix": bool,
}
COMMON = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "seed", "stop", "n",
          "presence_penalty", "frequency_penalty", "logprobs"}
CHAT_ONLY = {"messages", "max_completion_tokens", "tools", "tool_choice", "functions", "function_call", "audio",
             "modalities", "prediction", "web_search_options", "reasoning_effort", "response_format", "top_logprobs"}
COMPLETION_ONLY = {"prompt", "echo", "best_of", "suffix"}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
#: Most alternatives per token a request may ask for (llama.cpp's limit is 20; OpenAI's completions API allows 5).
MAX_TOP_LOGPROBS = 20
EMBED_FIELDS = {"model", "input", "encoding_format", "dimensions", "user", "tower"}
N = TypeVar("N", bound=float)


class FunctionCall(TypedDict):
    name: str
    #: The call's arguments as JSON text.
    arguments: str


class ToolCall(TypedDict):
    """An assistant's call of a function tool (OpenAI's chat shape)."""
    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(TypedDict):
    """A chat message as the tower takes it (inference/request.py): ``role``
    system, user, assistant or tool; ``content`` None only for an assistant's
    message that calls tools."""
    role: str
    content: str | None
    tool_calls: NotRequired[list[ToolCall]]
    #: A tool message: the call it answers.
    tool_call_id: NotRequired[str]
    name: NotRequired[str]


@dataclass
class Request:
    """A checked request: ``payload`` for Grid.execute("ai/inference"), the
    ``model`` name as asked, the stream options and ``top_logprobs``: how many
    alternatives per token the reply shows (None: no logprobs)."""
    payload: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool
    tower: str | None
    top_logprobs: int | None = None


@dataclass
class EmbedRequest:
    """A checked ``/v1/embeddings`` request: texts, ``base64`` answers
    (float32 little-endian) or lists of floats, ``dimensions`` to keep (None: all)."""
    model: str
    texts: list[str]
    base64: bool
    dimensions: int | None
    tower: str | None


def parse(body: object, chat: bool, known_models: Collection[str] = ()) -> Request:
    """Check an OpenAI request body. ``known_models``: aliases the grid serves,
    to tell ``MODEL:ADAPTER`` from an alias that holds a colon. Raises ApiError(400)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    _check_fields(body, chat)
    payload = model_fields(body, known_models)
    if chat:
        payload["messages"] = messages(body.get("messages"))
        tools(body, payload)
        response_format(body.get("response_format"), payload)
    else:
        payload["prompt"] = _prompt(body.get("prompt"))
    limit = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    sampling(body, payload, limit)
    top = _logprobs(body, payload, chat)
    stream = flag(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
        if not isinstance(options, dict) or not set(options) <= {"include_usage", "include_obfuscation"}:
            raise bad_request("'stream_options' may hold only 'include_usage'", "stream_options")
    include_usage = bool(options and flag(options, "include_usage", "stream_options.include_usage"))
    tower = payload.pop("tower", None)
    return Request(payload, body["model"], stream, include_usage, tower, top)


def parse_embeddings(body: object, known_models: Collection[str] = ()) -> EmbedRequest:
    """Check a ``/v1/embeddings`` body. Raises ApiError(400)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    for name in body:
        if name not in EMBED_FIELDS:
            raise bad_request(f"unrecognized request argument supplied: {name}", name)
    payload = model_fields(body, known_models)
    if "adapter" in payload:
        raise bad_request("embeddings come from a model without adapters", "model")
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise bad_request("'input' must be a non-empty string or a list of them (token arrays are not supported)",
                          "input")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise bad_request("'encoding_format' must be float or base64", "encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise bad_request("'dimensions' must be a positive integer", "dimensions")
    return EmbedRequest(payload["model"], texts, encoding == "base64", dimensions, payload.get("tower"))


def split_model(name: str, known_models: Collection[str]) -> tuple[str, str | None]:
    """(model, adapter or None) from ``MODEL`` or ``MODEL:ADAPTER``."""
    if name in known_models or ":" not in name:
        return name, None
    for i, ch in enumerate(name):
        if ch == ":" and name[:i] in known_models:
            return name[:i], name[i + 1:] or None
    return name, None


def model_fields(body: dict[str, Any], known_models: Collection[str]) -> dict[str, Any]:
    """{"model", "adapter"?, "tower"?} of a body's ``model`` (and ``adapter``, ``tower``). Raises ApiError(400)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' must be a model name", "model")
    base, adapter = split_model(model, known_models)
    if adapter and body.get("adapter") not in (None, adapter):
        raise bad_request(f"'model' names adapter {adapter!r} and 'adapter' names {body['adapter']!r}", "adapter")
    payload: dict[str, Any] = {"model": base}
    if adapter:
        payload["adapter"] = adapter
    for field in ("adapter", "tower"):
        if body.get(field) is not None:
            if not isinstance(body[field], str) or not body[field]:
                raise bad_request(f"'{field}' must be a name", field)
            payload[field] = body[field]
    return payload


def _check_fields(body: dict[str, Any], chat: bool) -> None:
    other = COMPLETION_ONLY if chat else CHAT_ONLY
    allowed = COMMON | EXTRAS | IGNORED | set(UNSUPPORTED) | (CHAT_ONLY if chat else COMPLETION_ONLY)
    for name, value in body.items():
        if name not in allowed or name in other:
            raise bad_request(f"unrecognized request argument supplied: {name}", name)
        if name in UNSUPPORTED and UNSUPPORTED[name](value):
            hint = " (use 'tools' and 'tool_choice')" if name in ("functions", "function_call") else ""
            raise bad_request(f"'{name}' is not supported by this grid (its models run on llama.cpp towers){hint}",
                              name, code="unsupported")
    if body.get("n") not in (None, 1):
        raise bad_request("'n' must be 1: the grid generates one choice per request", "n", code="unsupported")


def flag(body: dict[str, Any], name: str, param: str | None = None) -> bool:
    """The body's boolean ``name`` (False when absent or null). Raises ApiError(400) naming ``param``."""
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise bad_request(f"'{param or name}' must be true or false", param or name)
    return bool(value)


def number(body: dict[str, Any], name: str, lo: float, hi: float) -> float | None:
    """The body's number ``name`` within [lo, hi] (an int or a float, as given), or None when absent.
    Raises ApiError(400)."""
    return _ranged(body, name, lo, hi, (int, float), "a number")


def integer(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    """The body's integer ``name`` within [lo, hi], or None when absent. Raises ApiError(400)."""
    return _ranged(body, name, lo, hi, (int,), "an integer")


def _ranged(body: dict[str, Any], name: str, lo: float, hi: float, kinds: tuple[type[N], ...], kind: str) -> N | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, kinds) or not lo <= value <= hi:
        raise bad_request(f"'{name}' must be {kind} in [{lo}, {hi}], got {value!r}", name)
    return value


def sampling(body: dict[str, Any], payload: dict[str, Any], limit: str) -> None:
    """The payload's ``max_tokens`` (from the body's field ``limit``), sampling
    settings, ``seed`` and ``stop``, from the body's fields that are there. Raises ApiError(400)."""
    payload["max_tokens"] = integer(body, limit, 1, UNTIL_CONTEXT_ENDS) or UNTIL_CONTEXT_ENDS
    for field, lo, hi, whole in (("temperature", 0, 2, False), ("top_p", 0, 1, False), ("top_k", 0, 100_000, True),
                                 ("min_p", 0, 1, False), ("repeat_penalty", 0, 10, False),
                                 ("adapter_scale", -10, 10, False), ("presence_penalty", -2, 2, False),
                                 ("frequency_penalty", -2, 2, False)):
        value = integer(body, field, lo, hi) if whole else number(body, field, lo, hi)
        if value is not None:
            payload[field] = value if whole else float(value)
    seed = integer(body, "seed", -(1 << 63), (1 << 64) - 1)
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


def _logprobs(body: dict[str, Any], payload: dict[str, Any], chat: bool) -> int | None:
    """Chat: ``logprobs`` true and ``top_logprobs`` 0..20; completions: ``logprobs``
    a count 0..20. Sets the payload's; returns the alternatives to show (None: no logprobs)."""
    if chat:
        wanted = flag(body, "logprobs")
        top = integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
        if top is not None and not wanted:
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    else:
        top = integer(body, "logprobs", 0, MAX_TOP_LOGPROBS)
        wanted = top is not None
    if not wanted:
        return None
    payload["logprobs"] = True
    payload["top_logprobs"] = top or 0
    return top or 0


def tools(body: dict[str, Any], payload: dict[str, Any], flat: bool = False) -> None:
    """The payload's ``tools`` and ``tool_choice`` (function tools only) from a
    chat body's, or with ``flat`` from a Responses body's (a tool is {"type":
    "function", "name", "description"?, "parameters"?}, a forced choice
    {"type": "function", "name"}): the tower takes the chat shape. Raises ApiError(400)."""
    given, choice = body.get("tools"), body.get("tool_choice")
    if given in (None, []):
        if choice not in (None, "none", "auto"):
            raise bad_request("'tool_choice' needs 'tools'", "tool_choice")
        return
    if not isinstance(given, list):
        raise bad_request("'tools' must be a list of functions", "tools")
    functions = [_function_tool(tool, i, flat) for i, tool in enumerate(given)]
    names = [tool["function"]["name"] for tool in functions]
    if isinstance(choice, dict):
        named = choice if flat else choice.get("function")
        name = named.get("name") if isinstance(named, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str) or name not in names:
            raise bad_request("'tool_choice' must name a function of 'tools'", "tool_choice")
        choice = {"type": "function", "function": {"name": name}}
    elif choice not in (None, "auto", "none", "required"):
        forced = "{'type': 'function', 'name': ...}" if flat else "{'type': 'function', 'function': {'name': ...}}"
        raise bad_request(f"'tool_choice' must be auto, none, required or {forced}", "tool_choice")
    payload["tools"] = functions if flat else given
    if choice is not None:
        payload["tool_choice"] = choice


def _function_tool(tool: object, i: int, flat: bool) -> dict[str, Any]:
    """Tool ``i`` checked, in the chat shape."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise bad_request(f"tools[{i}].type must be 'function' (the only kind of tool the grid runs)",
                          f"tools[{i}].type", code="unsupported")
    fn, where = (tool, f"tools[{i}]") if flat else (tool.get("function"), f"tools[{i}].function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise bad_request(f"{where} needs a 'name'", f"{where}.name")
    if not isinstance(fn.get("parameters", {}), dict) and not (flat and fn["parameters"] is None):
        raise bad_request(f"{where}.parameters must be a JSON schema", f"{where}.parameters")
    if not flat:
        return tool
    return {"type": "function", "function": {key: fn[key] for key in ("name", "description", "parameters")
                                             if fn.get(key) is not None}}


def response_format(value: object, payload: dict[str, Any]) -> None:
    """The payload's ``response_format`` from a chat ``response_format`` (text, json_object, json_schema).
    Raises ApiError(400)."""
    if value is None or value == {"type": "text"}:
        return
    if not isinstance(value, dict) or value.get("type") not in ("json_object", "json_schema"):
        raise bad_request("'response_format.type' must be text, json_object or json_schema", "response_format.type")
    if value["type"] == "json_object":
        payload["response_format"] = {"type": "json_object"}
        return
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise bad_request("'response_format.json_schema' must be {'name', 'schema': {...}}",
                          "response_format.json_schema")
    payload["response_format"] = {"type": "json_schema", "json_schema": {"schema": spec.get("schema", {})}}


def messages(items: object) -> list[ChatMessage]:
    """OpenAI chat messages checked and trimmed to what the tower takes. Raises ApiError(400)."""
    if not isinstance(items, list) or not items:
        raise bad_request("'messages' must be a non-empty list", "messages")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(items)]


#: Fields of an assistant message that only echo a reply back (see _message).
ECHOED_FIELDS = {"annotations", "parsed"}


def _message(message: object, where: str) -> ChatMessage:
    if not isinstance(message, dict):
        raise bad_request(f"{where} must be an object", where)
    asked = message.get("role")
    role = ROLES.get(asked) if isinstance(asked, str) else None  # a list or an object is no key of ROLES
    if role is None:
        raise bad_request(f"{where}.role must be one of {', '.join(ROLES)}", f"{where}.role")
    allowed = {"role", "content", "name"} | ({"tool_calls", "refusal", "audio"} if role == "assistant" else set()) \
        | ({"tool_call_id"} if role == "tool" else set())
    # What a client SDK echoes back of an answer it got (OpenAI's reply message has
    # ``annotations``; openai-node's runTools adds its ``parsed`` content): said by
    # this gateway, read by nobody, so dropped. A legacy ``function_call`` is not.
    echoed = ECHOED_FIELDS if role == "assistant" else set()
    extra = sorted(set(message) - allowed - echoed)
    if extra:
        raise bad_request(f"{where}.{extra[0]} is not supported in a {message['role']} message",
                          f"{where}.{extra[0]}", code="unsupported")
    if message.get("audio") is not None:
        raise bad_request(f"{where}.audio is not supported by this grid", f"{where}.audio", code="unsupported")
    out: ChatMessage = {"role": role, "content": _content(message.get("content"), f"{where}.content",
                                             none_ok=role == "assistant" and bool(message.get("tool_calls")))}
    if role == "tool":
        if not isinstance(message.get("tool_call_id"), str):
            raise bad_request(f"{where}.tool_call_id must name the call this answers", f"{where}.tool_call_id")
        out["tool_call_id"] = message["tool_call_id"]
    if message.get("tool_calls"):
        out["tool_calls"] = _calls(message["tool_calls"], f"{where}.tool_calls")
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    return out


def _calls(calls: object, where: str) -> list[ToolCall]:
    if not isinstance(calls, list):
        raise bad_request(f"{where} must be a list", where)
    out: list[ToolCall] = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str) \
                or not isinstance(call.get("id", ""), str):
            raise bad_request(f"{where}[{j}] must be {{'id', 'type': 'function', 'function': {{'name', "
                              "'arguments': JSON text}}}}", f"{where}[{j}]")
        out.append({"id": call.get("id", ""), "type": "function",
                    "function": {"name": fn["name"], "arguments": fn["arguments"]}})
    return out


def _content(content: object, where: str, none_ok: bool = False) -> str | None:
    if isinstance(content, str):
        return content
    if content is None and none_ok:
        return None
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of text parts", where)
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise bad_request(f"{where}[{j}]: only text parts are supported (no images or audio)", f"{where}[{j}]",
                              code="unsupported")
        texts.append(part["text"])
    return "".join(texts)


def _prompt(prompt: object) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad_request("'prompt' must be one string (token arrays and several prompts are not supported)",
                          "prompt")
    return prompt
