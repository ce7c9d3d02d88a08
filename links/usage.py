"""A stream's usage: one shape from the tower's runner to the client's screen.

The tower fills a ``StreamUsage`` from what its engine measured
(inference/generation.py ``Generation.usage``) and sends ``to_map()`` in the
stream's end message (links/stream.py ``StreamEnd``); the client decodes it
once with ``StreamUsage.from_map`` and adds what only it can measure
(client/stream.py ``Usage``), which the CLI and the gateway print.

Every end usage map says which shape it is in ``"kind"`` (``USAGE_KIND``):
``"inference"`` (StreamUsage), ``"embeddings"`` (EmbeddingsUsage: StreamUsage's
keys plus ``dims`` and ``count``), ``"transcript"`` and ``"speech"``
(voice/request.py's TranscriptEnd and SpeechEnd). ``decode_usage`` reads a map
as the shape its tag names and refuses another known shape; a map without the
tag comes from a tower older than it and reads as the shape the stream expects.

Wire map of an inference stream (keys at 0 or empty are left out; a decoder
ignores keys it does not know)::

    {"kind": "inference",
     "prompt_tokens": int, "completion_tokens": int,
     "tower_ttft_s": float,   # the tower's prompt processing to the first token (seconds)
     "tokens_per_s": float,   # llama.cpp's eval rate: generated tokens over the time generating them
     "queued_s": float,       # seconds the request waited for a slot
     "tower": str,            # the tower's own name for itself
     "cached_tokens": int,    # prompt tokens the runner took from its cache
     "draft_tokens": int, "draft_accepted": int,   # speculative decoding: proposed, and held
     "split": [hex, ...],     # a split model's towers (destination hashes), the coordinator last
     "prompt_s": float,       # the engine's time reading the prompt (llama.cpp's prompt_ms / 1000)
     "decode_s": float}       # the engine's time generating after that (llama.cpp's predicted_ms / 1000)

``queued_s``, ``prompt_s`` and ``decode_s`` are spans of the tower's time one
after the other, so added up they never exceed the request's time at the
client: Ollama's load, prompt eval and eval durations are built from them
(gateway/ollama_reply.py). ``tower_ttft_s`` is not one of them: it ends when
the first text comes out, which for a constrained tool answer is its end. The
first token comes from the prompt's last batch, so llama.cpp's
``tokens_per_s`` is ``(completion_tokens - 1) / decode_s``.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Self, TypeVar

from links.wire import Code, WireError

#: The most tokens a count may say (anything above is no real stream).
MAX_TOKENS = 1 << 40
#: The longest a time may say (seconds; a week).
MAX_SECONDS = 7 * 86400.0
MAX_TOKENS_PER_S = 1e7
NAME_MAX = 64
MAX_SPLIT = 16


#: The key of an end usage map that names its shape.
USAGE_KIND = "kind"


class EndUsage(ABC):
    """A stream end's usage shape: ``KIND`` is its tag on the wire. Each shape
    has ``to_map()`` (tagged) and ``from_map(raw)``, which trusts no field and
    never raises. A subclass that sets its own KIND registers by it (``kinds()``)."""
    KIND: ClassVar[str] = ""
    _by_kind: ClassVar[dict[str, type["EndUsage"]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A shape of its own; a subclass that only adds to one (client/pieces.py's Usage) is not.
        if "KIND" in cls.__dict__:
            EndUsage._by_kind[cls.KIND] = cls

    @staticmethod
    def kinds() -> dict[str, type["EndUsage"]]:
        """Every shape known in this process, by tag."""
        return dict(EndUsage._by_kind)

    @abstractmethod
    def to_map(self) -> dict[str, Any]:
        """The usage map, with ``USAGE_KIND``."""

    @classmethod
    @abstractmethod
    def from_map(cls, raw: object) -> Self:
        """Read a usage map (anything the wire gave), trusting no field."""


_Usage = TypeVar("_Usage", bound=EndUsage)


def decode_usage(raw: object, expected: type[_Usage]) -> _Usage:
    """``raw`` (an end message's usage map) read as ``expected``. Its ``kind``
    tag must name that shape; a map without a tag (an older tower) or with one
    this end does not know (a newer one) is read as ``expected``, field by
    field. Raises WireError(internal) when the tag names another known shape:
    the tower ended the stream with another stream's figures."""
    kind = raw.get(USAGE_KIND) if isinstance(raw, dict) else None
    if isinstance(kind, str) and kind != expected.KIND and kind in EndUsage._by_kind:
        raise WireError(Code.INTERNAL, f"the stream ended with {kind!r} figures where "
                                       f"{expected.KIND!r} ones belong")
    return expected.from_map(raw)


@dataclass(frozen=True)
class StreamUsage(EndUsage):
    """An inference stream's end figures as its tower reports them: token
    counts, times in seconds, the rate in tokens/s (see the module doc)."""
    KIND: ClassVar[str] = "inference"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tower_ttft_s: float = 0.0
    tokens_per_s: float = 0.0
    queued_s: float = 0.0
    tower: str = ""
    cached_tokens: int = 0
    draft_tokens: int = 0
    draft_accepted: int = 0
    split: tuple[str, ...] = ()
    prompt_s: float = 0.0
    decode_s: float = 0.0

    def to_map(self) -> dict[str, Any]:
        """The end message's usage map, tagged (fields at their default left out)."""
        return {USAGE_KIND: self.KIND, **{f.name: list(value) if isinstance(value, tuple) else value
                                          for f in fields(StreamUsage) if (value := getattr(self, f.name)) != f.default}}

    @classmethod
    def from_map(cls, raw: object) -> Self:
        """Decode a tower's usage map, trusting no field: one of the wrong
        type or out of range reads as unknown (0, "" or empty), so a stream
        that ended is never lost to a figure."""
        raw = raw if isinstance(raw, dict) else {}
        counts = {key: _count(raw.get(key)) for key in ("prompt_tokens", "completion_tokens", "cached_tokens",
                                                       "draft_tokens", "draft_accepted")}
        return cls(**counts, tower_ttft_s=_number(raw.get("tower_ttft_s"), MAX_SECONDS),
                   tokens_per_s=_number(raw.get("tokens_per_s"), MAX_TOKENS_PER_S),
                   queued_s=_number(raw.get("queued_s"), MAX_SECONDS), tower=_name(raw.get("tower")),
                   split=_split(raw.get("split")), prompt_s=_number(raw.get("prompt_s"), MAX_SECONDS),
                   decode_s=_number(raw.get("decode_s"), MAX_SECONDS))


@dataclass(frozen=True)
class EmbeddingsUsage(EndUsage):
    """An embeddings stream's end: its ``usage`` (prompt tokens, queue time,
    tower) and the vectors it sent, ``count`` of ``dims`` float32 each."""
    KIND: ClassVar[str] = "embeddings"
    usage: StreamUsage = field(default_factory=StreamUsage)
    dims: int = 0
    count: int = 0

    def to_map(self) -> dict[str, Any]:
        return {**self.usage.to_map(), USAGE_KIND: self.KIND, "dims": self.dims, "count": self.count}

    @classmethod
    def from_map(cls, raw: object) -> Self:
        """Read like StreamUsage.from_map; a bad ``dims`` or ``count`` reads as 0."""
        counts = raw if isinstance(raw, dict) else {}
        return cls(usage=StreamUsage.from_map(raw), dims=_count(counts.get("dims")),
                   count=_count(counts.get("count")))


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS else 0


def _number(value: object, most: float) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= most:
        return float(value)
    return 0.0  # also NaN, which fails both comparisons


def _name(value: object) -> str:
    return value if isinstance(value, str) and len(value) <= NAME_MAX and value.isprintable() else ""


def _split(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_SPLIT:
        return ()
    hashes = tuple(v for v in value if isinstance(v, str) and len(v) == 32)
    return hashes if len(hashes) == len(value) and all(_is_hex(h) for h in hashes) else ()


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True
