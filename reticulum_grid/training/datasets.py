"""Training datasets: JSONL, one example per line, either chat or plain text::

    {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}
    {"text": "..."}

``read_examples`` is used to validate a dataset before a job is accepted and
again by the training worker; its errors name the line.
"""

import json
import os
from typing import Any

#: One example: {"messages": [{"role", "content"}, ...]} or {"text": str}.
Example = dict[str, Any]

ROLES = ("system", "user", "assistant")


class DatasetError(ValueError):
    pass


def read_examples(path: str | os.PathLike[str], max_bytes: int | None = None) -> list[Example]:
    """List of examples (dicts with "messages" or "text"). Raises DatasetError.

    With ``max_bytes`` only that much is checked (enough to reject a wrong file
    quickly); the worker reads everything."""
    examples = []
    with open(path, "rb") as f:
        data = f.read(max_bytes) if max_bytes else f.read()
    lines = data.split(b"\n")
    if max_bytes and len(data) == max_bytes:
        lines = lines[:-1]  # the last line may be cut
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            example = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DatasetError(f"line {number}: not JSON ({e})") from None
        except RecursionError:
            raise DatasetError(f"line {number}: nested too deeply") from None
        examples.append(_check(example, number))
    if not examples:
        raise DatasetError("the dataset has no examples")
    return examples


def _check(example: object, number: int) -> Example:
    if not isinstance(example, dict):
        raise DatasetError(f"line {number}: an example must be a JSON object")
    if "messages" in example:
        messages = example["messages"]
        if not isinstance(messages, list) or not messages:
            raise DatasetError(f"line {number}: 'messages' must be a non-empty list")
        for i, m in enumerate(messages):
            if (not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str)):
                raise DatasetError(f"line {number}: messages[{i}] needs a role ({', '.join(ROLES)}) "
                                   "and string content")
        return {"messages": [{"role": m["role"], "content": m["content"]} for m in messages]}
    if isinstance(example.get("text"), str) and example["text"]:
        return {"text": example["text"]}
    raise DatasetError(f"line {number}: an example needs 'messages' or a non-empty 'text'")
