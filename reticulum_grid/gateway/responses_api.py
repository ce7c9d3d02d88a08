"""OpenAI's Responses API requests on the grid: ``POST /v1/responses`` bodies.

``parse(body, known_models)`` checks a body and turns it into the chat payload
of ``ai/inference`` (inference/request.py) that ``/v1/chat/completions``
sends, through the same checks (openai_api.py): ``input`` (a string, or a
list of messages and ``function_call`` / ``function_call_output`` items)
becomes chat messages after the ``instructions`` (a system message);
``tools`` (function tools), ``tool_choice``, ``text.format`` (json_object,
json_schema), ``max_output_tokens``, ``temperature``, ``top_p`` and the
logprobs (``include`` ``message.output_text.logprobs``, ``top_logprobs``) go
to the tower. ``previous_response_id`` names a stored response whose conversation
comes first (responses_store.py); its instructions are not carried over, as
OpenAI's are not. Shapes: openai-python's ``types/responses``
(``response_create_params.py``, ``response_input_item_param.py``).

As on OpenAI's own Responses API, a field it does not define is a 400
"Unknown parameter" naming it. What the grid cannot do (images and files,
built-in tools, reasoning, background runs, conversations, prompt
templates, truncation ``auto``) is a 400 rather than ignored;
fields that change nothing about the answer (``user``, ``metadata``,
``service_tier``, ...) are accepted. ``reasoning`` items in the input are
dropped: no model of the grid reasons in them. Reply shapes: responses_reply.py.
"""

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from reticulum_grid.gateway import openai_api
from reticulum_grid.gateway.errors import bad_request
from reticulum_grid.gateway.openai_api import ChatMessage

#: Fields of OpenAI's Responses API that go to the tower (as the chat API's do) or shape the reply.
USED = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
        "text", "stream", "stream_options", "previous_response_id", "store", "metadata", "parallel_tool_calls",
        "truncation", "include", "top_logprobs"}
#: Fields accepted and ignored: they do not change the answer (``max_tool_calls`` bounds built-in tools only).
IGNORED = {"user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options",
           "service_tier", "max_tool_calls", "access_programs"}
#: Fields the grid cannot honour, with the test for "asks for something"; the reason shown.
UNSUPPORTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "background": (bool, "background responses need a server that keeps running them; stream instead"),
    "background_options": (bool, "background responses are not supported"),
    "conversation": (lambda v: v is not None, "conversations are not kept; use previous_response_id or send "
                                              "the whole input"),
    "prompt": (bool, "stored prompt templates are OpenAI's; send 'instructions' and 'input'"),
    "reasoning": (lambda v: v is not None and (not isinstance(v, dict) or any(x is not None for x in v.values())),
                  "the grid's models do not reason in separate items"),
    "context_management": (bool, "server-side compaction is not supported"),
    "moderation": (bool, "moderation is not supported"),
    "image": (bool, "images are not supported"),
    "truncation": (lambda v: v not in (None, "disabled"), "only 'disabled' is supported: an input longer than the "
                                                          "context window is a 400"),
}
#: ``include`` values served: the text's logprobs, and reasoning items' content (none are made).
LOGPROBS = "message.output_text.logprobs"
INCLUDABLE = {LOGPROBS, "reasoning.encrypted_content"}
#: Input message roles (OpenAI's EasyInputMessage) and the part types each may hold.
PARTS = {"user": {"input_text"}, "system": {"input_text"}, "developer": {"input_text"},
         "assistant": {"output_text", "input_text", "refusal"}}
#: Keys each input item may carry (openai-python's response_input_item_param.py; ``phase``,
#: ``caller``, ``namespace`` and ``async`` are labels that change nothing here).
ITEM_KEYS = {"message": {"type", "role", "content", "id", "status", "phase"},
             "function_call": {"type", "call_id", "name", "arguments", "id", "status", "namespace", "caller", "async"},
             "function_call_output": {"type", "call_id", "output", "id", "status", "caller", "name", "namespace"},
             "reasoning": {"type", "id", "summary", "content", "encrypted_content", "status"}}


@dataclass
class Request:
    """A checked ``/v1/responses`` request: ``payload`` for Grid.execute("ai/inference")
    without its messages (see ``messages``); ``turn``: this request's input as chat
    messages; ``echo``: the request's settings a Response object repeats;
    ``top_logprobs``: alternatives per token the reply shows (None: no logprobs)."""
    payload: dict[str, Any]
    model: str
    stream: bool
    tower: str | None
    instructions: str | None
    turn: list[ChatMessage]
    previous_id: str | None
    store: bool
    echo: dict[str, Any] = field(default_factory=dict)
    top_logprobs: int | None = None

    def messages(self, history: Sequence[ChatMessage] = ()) -> list[ChatMessage]:
        """The chat messages for the tower: instructions, ``history`` (the previous
        responses' messages, oldest first), then this turn. Raises ApiError(400) when empty."""
        system: list[ChatMessage] = [{"role": "system", "content": self.instructions}] if self.instructions else []
        out = system + list(history) + self.turn
        if not history and not self.turn:
            raise bad_request("'input' must hold at least one message", "input")
        return out


def parse(body: object, known_models: Collection[str] = ()) -> Request:
    """Check a ``POST /v1/responses`` body. Raises ApiError(400) naming the field."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    _check_fields(body)
    payload = openai_api.model_fields(body, known_models)
    tower = payload.pop("tower", None)
    openai_api.tools(body, payload, flat=True)
    text = _text(body.get("text"), payload)
    openai_api.sampling(body, payload, "max_output_tokens")
    top = _logprobs(body, payload)
    stream = openai_api.flag(body, "stream")
    if body.get("stream_options") is not None:
        options = body["stream_options"]
        if not stream or not isinstance(options, dict) or not set(options) <= {"include_obfuscation"}:
            raise bad_request("'stream_options' may hold only 'include_obfuscation', with 'stream': true",
                              "stream_options")
    store = body.get("store") is None or openai_api.flag(body, "store")
    instructions = _optional_str(body, "instructions")
    previous = _optional_str(body, "previous_response_id")
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise bad_request("'metadata' must be a map of strings", "metadata")
    parallel = body.get("parallel_tool_calls") is None or openai_api.flag(body, "parallel_tool_calls")
    echo = {"instructions": instructions, "max_output_tokens": body.get("max_output_tokens"), "metadata": metadata,
            "parallel_tool_calls": parallel,
            "previous_response_id": previous, "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "text": {"format": text}, "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [], "truncation": "disabled", "user": body.get("user"), "store": store,
            "top_logprobs": body.get("top_logprobs")}
    return Request(payload, body["model"], stream, tower, instructions, input_messages(body.get("input")),
                   previous, store, echo, top)


def _logprobs(body: dict[str, Any], payload: dict[str, Any]) -> int | None:
    """Alternatives per token to show when ``include`` asks for the text's logprobs
    (sets the payload's), else None: without it OpenAI shows none either."""
    top = openai_api.integer(body, "top_logprobs", 0, openai_api.MAX_TOP_LOGPROBS)
    if LOGPROBS not in (body.get("include") or ()):
        return None
    payload["logprobs"], payload["top_logprobs"] = True, top or 0
    return top or 0


def _check_fields(body: dict[str, Any]) -> None:
    allowed = USED | IGNORED | set(UNSUPPORTED) | openai_api.EXTRAS
    for name, value in body.items():
        if name not in allowed:
            raise bad_request(f"Unknown parameter: '{name}'.", name)
        if name in UNSUPPORTED and UNSUPPORTED[name][0](value):
            raise bad_request(f"'{name}' is not supported by this grid: {UNSUPPORTED[name][1]}", name,
                              code="unsupported")
    include = body.get("include")
    if include is not None and (not isinstance(include, list) or not all(isinstance(v, str) for v in include)):
        raise bad_request("'include' must be a list of strings", "include")
    for value in include or ():
        if value not in INCLUDABLE:
            raise bad_request(f"'include' value {value!r} is not supported by this grid", "include",
                              code="unsupported")


def _optional_str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise bad_request(f"'{name}' must be a string", name)
    return value or None


def _text(value: object, payload: dict[str, Any]) -> dict[str, Any]:
    """The reply's ``text.format`` (sets the payload's response_format)."""
    if value is None:
        return {"type": "text"}
    if not isinstance(value, dict) or not set(value) <= {"format", "verbosity"}:
        raise bad_request("'text' must be {'format': {...}}", "text")
    if value.get("verbosity") not in (None, "medium"):
        raise bad_request("'text.verbosity' is not supported by this grid (its models have one verbosity)",
                          "text.verbosity", code="unsupported")
    fmt = value.get("format")
    if fmt is None or fmt == {"type": "text"}:
        return {"type": "text"}
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_object", "json_schema"):
        raise bad_request("'text.format.type' must be text, json_object or json_schema", "text.format.type")
    if fmt["type"] == "json_schema":
        if not isinstance(fmt.get("name"), str) or not fmt["name"]:
            raise bad_request("'text.format.name' is required for a json_schema format", "text.format.name")
        if not isinstance(fmt.get("schema"), dict):
            raise bad_request("'text.format.schema' must be a JSON schema (an object)", "text.format.schema")
        openai_api.response_format({"type": "json_schema", "json_schema": {"schema": fmt["schema"]}}, payload)
    else:
        openai_api.response_format({"type": "json_object"}, payload)
    return fmt


def input_messages(value: object) -> list[ChatMessage]:
    """Chat messages (openai_api's shape, roles mapped) of a Responses ``input``:
    a string (one user message) or a list of items. Raises ApiError(400)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise bad_request("'input' must be a string or a list of input items", "input")
    out: list[ChatMessage] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object (a message or an item)", where)
        kind = item.get("type", "message" if "role" in item else None)
        if not isinstance(kind, str) or kind not in ITEM_KEYS:  # (a list is no key: it cannot be looked up)
            raise bad_request(f"{where}.type {kind!r} is not supported by this grid (it takes messages, "
                              "function_call and function_call_output items)", f"{where}.type", code="unsupported")
        extra = sorted(set(item) - ITEM_KEYS[kind])
        if extra:
            raise bad_request(f"Unknown parameter: '{where}.{extra[0]}'.", f"{where}.{extra[0]}")
        if kind == "message":
            out.append(_message(item, where))
        elif kind == "function_call":
            _call(item, where, out)
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": _field(item, "call_id", where),
                        "content": _parts(item.get("output"), {"input_text"}, f"{where}.output")})
    return out


def _field(item: dict[str, Any], name: str, where: str) -> str:
    if not isinstance(item.get(name), str):
        raise bad_request(f"{where}.{name} must be a string", f"{where}.{name}")
    return item[name]


def _message(item: dict[str, Any], where: str) -> ChatMessage:
    role = item.get("role")
    if not isinstance(role, str) or role not in PARTS:
        raise bad_request(f"{where}.role must be one of {', '.join(PARTS)}", f"{where}.role")
    return {"role": openai_api.ROLES[role], "content": _parts(item.get("content"), PARTS[role], f"{where}.content")}


def _call(item: dict[str, Any], where: str, out: list[ChatMessage]) -> None:
    """A function_call item joins the assistant message before it (its text and calls are one chat turn)."""
    call: openai_api.ToolCall = {"id": _field(item, "call_id", where), "type": "function",
            "function": {"name": _field(item, "name", where), "arguments": _field(item, "arguments", where)}}
    if not (out and out[-1]["role"] == "assistant"):
        out.append({"role": "assistant", "content": None})
    out[-1].setdefault("tool_calls", []).append(call)


def _parts(content: object, kinds: set[str], where: str) -> str:
    """The text of a string or of a list of text parts (``kinds``: the part types allowed)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of content parts", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        key = "refusal" if kind == "refusal" else "text"
        if not isinstance(kind, str) or kind not in kinds or not isinstance(part.get(key), str):
            allowed = " or ".join(sorted(kinds))
            raise bad_request(f"{where}[{j}] must be a {allowed} part (images, files and audio are not supported)",
                              f"{where}[{j}]", code="unsupported")
        texts.append(part[key])
    return "".join(texts)
