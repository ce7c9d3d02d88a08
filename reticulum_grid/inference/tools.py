"""Tool calls for models whose chat template knows no tools.

llama-server parses tool calls for the templates that describe tools (its
``/props`` ``chat_template_caps.supports_tools``: Llama 3.1+, Qwen 2.5+,
Hermes, Mistral, ...) and ignores ``tools`` for the rest. For those (the
bundled SmolLM2 among them) a tower asks in the model's own template, with a
system message that lists the tools, for one JSON object that a JSON schema
constrains (llama.cpp turns it into a grammar):
``{"tool_call": {"name": NAME, "arguments": {...}}}``, or with ``tool_choice``
"auto" also ``{"response": TEXT}``. A forced function (``tool_choice`` naming
it) allows only that call, so even a model that never saw a tool answers with
a well-formed call. The answer comes back in OpenAI's shapes.

**The answer as it grows** (``Answer``). The JSON is read as the model writes
it, with jiter's partial mode (pydantic's JSON reader, which parses a JSON
prefix): a ``response`` string goes out as text piece by piece, its escapes
decoded, and a call's head (id, name) as soon as its name is whole; its
arguments (a JSON object, as OpenAI sends them) when the answer ends. So the
grammar's JSON never reaches a client, not even when ``max_tokens`` cuts the
answer: then the client has the text so far, or the call with the arguments
so far (whole keys; a string value cut short keeps its beginning) and
``finish_reason`` "length"; an answer cut before it says which kind it is
gives no text and no call.

**After a tool's result** (``prompt``). A small model that never learnt tool
use copies its own last turn: given the call as JSON and then the result as a
user turn, the bundled model called the same tool again in 9 of 10 seeds
(temperature 0.8, "What is the weather in Paris?"), and agent loops ran to
their frameworks' step limits. Two levers, both for such templates only:

- The results go into the prompt as context beside the question they answer,
  the shape instruction-tuned models read best: the user's message gets a
  line per result, ``The NAME tool says: RESULT`` (answered from the result
  in 102 of 160 seeds over five questions, against 79 for a ``Tool results:``
  block); the calls themselves are not replayed as assistant turns.
- One call per tool per user turn: under "auto", a tool whose result came
  back since the user's last message is not offered again (neither in the
  system message nor in the grammar); once none is left, the system message
  asks for an answer from the results and the grammar allows only
  ``{"response": ...}``. A grammar cannot leave out just the one set of
  arguments already called (llama.cpp's JSON schema reader has no ``not``),
  so the whole tool waits for the next user message: a question that needs
  the same tool twice gets one call of it per turn from such a model. With
  both levers the bundled model answered from the result in 20 of 20 seeds
  of the same case. A forced function stays forced: the client asked for it.
"""

import json
import secrets
from collections import Counter
from typing import Any, Literal

import jiter

#: A chat message or a tool, in OpenAI's shapes (JSON maps).
Message = dict[str, Any]
Tool = dict[str, Any]

TOOLS = "You can call these tools:"
INSTRUCTION = 'Answer with one JSON object: {"tool_call": {"name": <tool name>, "arguments": <arguments>}}'
AUTO_INSTRUCTION = ' to call a tool, or {"response": <your answer>} to answer directly.'
#: The system message once every tool offered has answered in this turn.
ANSWER_INSTRUCTION = "Answer the user with the tool results you are given."


def prompt(history: list[Message], tools: list[Tool],
           choice: str | dict[str, Any] | None) -> tuple[list[Message], dict[str, Any]]:
    """(messages for a template without tools, the JSON schema of the one answer
    allowed) for a chat ``history`` offering ``tools`` with ``tool_choice``
    ``choice`` (None, "auto", "required" or {"function": {"name"}}), as the
    module doc says."""
    offered = tools
    if choice in (None, "auto"):
        answered = _answered(history)
        offered = [t for t in tools if t["function"]["name"] not in answered]
    return _messages(history, offered, choice), _schema(offered, choice)


def _messages(history: list[Message], tools: list[Tool], choice: str | dict[str, Any] | None) -> list[Message]:
    """``history`` with its tool results in the users' messages and a system
    message that lists ``tools`` (or asks for an answer when none is left)."""
    if tools:  # the instruction last, nearest the conversation: the bundled model follows it more often
        described = "\n".join(json.dumps(t["function"], sort_keys=True) for t in tools)
        note = f"{TOOLS}\n{described}\n\n{INSTRUCTION}" + (AUTO_INSTRUCTION if choice in (None, "auto") else ".")
    else:
        note = ANSWER_INSTRUCTION
    out = _folded(history)
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": out[0]["content"] + "\n\n" + note}] + out[1:]
    return [{"role": "system", "content": note}] + out


def _folded(history: list[Message]) -> list[Message]:
    """``history`` with each run of tool results at the end of the user message
    before it (a user message of its own when the assistant spoke in between);
    tool calls are not replayed."""
    out: list[Message] = []
    calls: dict[str, dict[str, Any]] = {}  # call id -> OpenAI function {name, arguments}
    run: list[Message] = []  # tool results not put in yet
    for m in history:
        if m["role"] == "tool":
            run.append(m)
            continue
        calls.update({c.get("id", ""): c["function"] for c in m.get("tool_calls") or ()})
        if m["role"] != "assistant" or _text(m) or not m.get("tool_calls"):
            _put(out, run, calls)
            run = []
            out.append({"role": m["role"], "content": _text(m)})
    _put(out, run, calls)
    return out


def _put(out: list[Message], run: list[Message], calls: dict[str, dict[str, Any]]) -> None:
    """Put the results of ``run`` (tool messages) at the end of ``out``, a line
    each: ``The NAME tool says: RESULT``, ``The NAME tool says, for ARGUMENTS:
    RESULT`` where the run holds several calls of one tool."""
    if not run:
        return
    found = [(calls.get(m.get("tool_call_id", "")), m) for m in run]
    repeated = Counter(call["name"] for call, _ in found if call)
    lines = []
    for call, m in found:
        if call is None:
            lines.append(f"The {m.get('name') or 'a'} tool says: {_text(m)}")
        elif repeated[call["name"]] > 1:
            arguments = _loads(call["arguments"])
            shown = call["arguments"] if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
            lines.append(f"The {call['name']} tool says, for {shown}: {_text(m)}")
        else:
            lines.append(f"The {call['name']} tool says: {_text(m)}")
    if out and out[-1]["role"] == "user":
        out[-1] = {"role": "user", "content": out[-1]["content"] + "\n\n" + "\n".join(lines)}
    else:
        out.append({"role": "user", "content": "\n".join(lines)})


def _answered(history: list[Message]) -> set[str]:
    """Names of the tools whose results came back since the last user message."""
    since = max((i for i, m in enumerate(history) if m["role"] == "user"), default=-1)
    calls = {c.get("id", ""): c["function"]["name"] for m in history for c in m.get("tool_calls") or ()}
    return {str(calls.get(m.get("tool_call_id", ""), m.get("name") or ""))
            for m in history[since + 1:] if m["role"] == "tool"} - {""}


def _schema(tools: list[Tool], choice: str | dict[str, Any] | None) -> dict[str, Any]:
    """The JSON schema of the one answer allowed."""
    if isinstance(choice, dict):
        allowed = [t for t in tools if t["function"]["name"] == choice["function"]["name"]]
    else:
        allowed = tools
    calls: list[dict[str, Any]]
    calls = [{"type": "object", "required": ["tool_call"], "additionalProperties": False, "properties": {
        "tool_call": {"type": "object", "required": ["name", "arguments"], "additionalProperties": False,
                      "properties": {"name": {"const": t["function"]["name"]},
                                     "arguments": t["function"].get("parameters") or {"type": "object"}}}}}
             for t in allowed]
    if choice in (None, "auto"):
        calls.append({"type": "object", "required": ["response"], "additionalProperties": False,
                      "properties": {"response": {"type": "string"}}})
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


class Answer:
    """The model's JSON answer, read as it grows (see the module doc).

    ``feed(text)`` takes the next generated text and gives (new content text,
    OpenAI tool_calls deltas); ``end()`` gives the deltas that complete the
    answer, whole or cut; ``called`` says whether it is a tool call."""

    def __init__(self) -> None:
        self._raw = ""
        self._sent = 0  # characters of the response string given out
        self._call_id = ""

    @property
    def called(self) -> bool:
        return bool(self._call_id)

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        self._raw += text
        value = _partial(self._raw, "trailing-strings")
        if "tool_call" in value:
            return "", self._head()
        return self._text(value), []

    def end(self) -> tuple[str, list[dict[str, Any]]]:
        value = _partial(self._raw, "trailing-strings")
        if not self._call_id:
            return self._text(value), []
        arguments = _call(value).get("arguments")
        return "", [{"index": 0, "function": {"arguments": json.dumps({} if arguments is None else arguments)}}]

    def _text(self, value: dict[str, Any]) -> str:
        response = value.get("response")
        if not isinstance(response, str):
            return ""
        new = response[self._sent:]
        self._sent += len(new)
        return new

    def _head(self) -> list[dict[str, Any]]:
        if self._call_id:
            return []
        name = _call(_partial(self._raw, "on")).get("name")  # "on": a string only once it is whole
        if not isinstance(name, str):
            return []
        self._call_id = f"call_{secrets.token_hex(12)}"
        return [{"index": 0, "id": self._call_id, "type": "function", "function": {"name": name, "arguments": ""}}]


def _partial(raw: str, mode: Literal["on", "trailing-strings"]) -> dict[str, Any]:
    """The answer so far as a map ({} before its first whole key). ``mode``:
    jiter's partial mode ("on": unfinished strings left out, "trailing-strings":
    kept). jiter refuses a lone UTF-16 surrogate escape, which the grammar
    allows; Python's reader takes it once the answer is whole."""
    try:
        value = jiter.from_json(raw.encode("utf-8"), partial_mode=mode)
    except ValueError:
        value = _loads(raw)
    return value if isinstance(value, dict) else {}


def _call(value: dict[str, Any]) -> dict[str, Any]:
    call = value.get("tool_call")
    return call if isinstance(call, dict) else {}


def _text(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content)
    return content or ""


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text
