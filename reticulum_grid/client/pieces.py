"""What an inference stream yields (client/stream.py): text pieces, tool-call
pieces and the closing Usage, with the checks that turn a tower's per-token
probabilities and tool-call deltas into them, trusting no field."""

from dataclasses import dataclass, fields
from typing import Any, cast

from links.usage import StreamUsage


class Text(str):
    """A piece of streamed text; ``logprobs``: its tokens' log probabilities
    when the request asked for them ([{token, logprob, bytes, top: [...]}])."""
    logprobs: list[dict[str, Any]] | tuple[()] = ()


@dataclass
class ToolCallDelta:
    """A piece of a tool call the model makes, in OpenAI's streaming shape:
    ``index`` says which call; ``id`` and ``name`` come with its first piece,
    ``arguments`` is the next fragment of its JSON arguments."""
    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True)
class Usage(StreamUsage):
    """Ends an inference stream: the tower's StreamUsage (links/usage.py:
    tokens, ``tower_ttft_s``, tokens/s, ``queued_s``, cached and drafted
    tokens) with what only this client knows. Times in seconds.

    ``ttft_s`` is measured by the client, from execute() to the first text;
    ``tower`` is the (last) tower's name as this client knows it (never its
    own word); ``finish_reason`` is the tower's; ``failovers`` counts towers
    that failed mid-stream and were replaced. Counts cover the whole stream,
    over every tower that served it."""
    ttft_s: float = 0.0
    finish_reason: str = ""
    failovers: int = 0

    @classmethod
    def of(cls, reported: StreamUsage, **measured: object) -> "Usage":
        """``reported`` with the client's own figures (any Usage field) over it."""
        return cls(**{**{f.name: getattr(reported, f.name) for f in fields(StreamUsage)}, **measured})

    def summary(self) -> str:
        """The line ``rngrid infer`` shows after the answer."""
        return (f"{self.completion_tokens} tokens from {self.tower}, TTFT {self.ttft_s * 1000:.0f} ms, "
                f"{self.tokens_per_s:.1f} tokens/s, finish: {self.finish_reason}")


def logprob(item: object, top: bool = True) -> dict[str, Any] | None:
    """One token's probability from the tower, checked: {token, logprob (<= 0),
    bytes: [0..255], top: [...]}; None when it is not that."""
    if not isinstance(item, dict) or not isinstance(item.get("token"), str):
        return None
    lp, raw = item.get("logprob"), item.get("bytes")
    number = isinstance(lp, (int, float)) and not isinstance(lp, bool) and lp == lp  # not NaN
    lp = min(0.0, max(-1e9, float(cast(float, lp)))) if number else 0.0  # number: lp is an int or float
    raw = [b for b in raw if isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 255] \
        if isinstance(raw, list) else []
    out = {"token": item["token"], "logprob": float(lp), "bytes": raw}
    if top:
        alternatives = item["top"] if isinstance(item.get("top"), list) else ()
        out["top"] = [t for t in (logprob(a, top=False) for a in alternatives[:20]) if t is not None]
    return out


def logprobs(items: object) -> list[dict[str, Any]]:
    """The tower's per-token probabilities ([{token, logprob, bytes, top}]), each checked."""
    if not isinstance(items, (list, tuple)):
        return []
    return [lp for lp in map(logprob, items) if lp is not None]


def tool_call(delta: dict[str, Any]) -> ToolCallDelta:
    """A ToolCallDelta from the tower's (OpenAI-shaped) delta map, trusting no field."""
    fn = delta["function"] if isinstance(delta.get("function"), dict) else {}

    def text(value: object) -> str:
        return value if isinstance(value, str) else ""
    index = delta.get("index")
    return ToolCallDelta(index if isinstance(index, int) and not isinstance(index, bool) else 0, text(delta.get("id")),
                         text(fn.get("name")), text(fn.get("arguments")))
