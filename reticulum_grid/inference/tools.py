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
"""

import json
import secrets
from typing import Any

#: A chat message or a tool, in OpenAI's shapes (JSON maps).
Message = dict[str, Any]
Tool = dict[str, Any]

INSTRUCTION = ("You can call these tools. Answer with one JSON object: "
               '{"tool_call": {"name": <tool name>, "arguments": <arguments>}}')
AUTO_INSTRUCTION = ' to call a tool, or {"response": <your answer>} to answer directly.'


def messages(history: list[Message], tools: list[Tool], choice: str | dict[str, Any] | None) -> list[Message]:
    """``history`` for a template without tools: the tools described in a system
    message; earlier calls and tool results as plain text."""
    described = "\n".join(json.dumps(t["function"], sort_keys=True) for t in tools)
    note = INSTRUCTION + (AUTO_INSTRUCTION if choice in (None, "auto") else ".") + "\n" + described
    out: list[Message] = []
    for m in history:
        if m["role"] == "tool":
            out.append({"role": "user", "content": f"Tool result ({m.get('tool_call_id', '')}): {_text(m)}"})
        elif m.get("tool_calls"):
            calls = [{"tool_call": {"name": c["function"]["name"], "arguments": _loads(c["function"]["arguments"])}}
                     for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": " ".join(json.dumps(c) for c in calls)})
        else:
            out.append({"role": m["role"], "content": _text(m)})
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": out[0]["content"] + "\n\n" + note}] + out[1:]
    return [{"role": "system", "content": note}] + out


def schema(tools: list[Tool], choice: str | dict[str, Any] | None) -> dict[str, Any]:
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


def answer(text: str) -> tuple[str, list[dict[str, Any]]]:
    """(content text, OpenAI tool_calls deltas) from the model's JSON answer."""
    value = _loads(text)
    if isinstance(value, dict) and isinstance(value.get("tool_call"), dict):
        call = value["tool_call"]
        return "", [{"index": 0, "id": f"call_{secrets.token_hex(12)}", "type": "function",
                     "function": {"name": str(call.get("name", "")),
                                  "arguments": json.dumps(call.get("arguments", {}))}}]
    if isinstance(value, dict) and isinstance(value.get("response"), str):
        return value["response"], []
    return text, []


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
