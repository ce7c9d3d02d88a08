"""A Channel message written as its fields: the one base of the grid's message types.

A message type is a ``@dataclass`` subclass of ``Message`` with a MSGTYPE
(links/protocol.py registers each): it goes on the wire as the msgpack array
of its fields in the order they are declared (its family's id first: stream,
transfer and tunnel messages take it from their family's base), and
``unpack`` passes each item through its field's check (``uint_field``,
``text_field``, ``free_text``, ``bytes_field``, ``map_field``, or
``checked``/``checked_new`` with a check of the module's own), which gives
the value to keep or raises ProtocolError. Every field has a default, so RNS
can make an empty message to unpack into, as its Channel does.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, Self, TypeVar

import msgpack
import RNS

from links.channel import MAX_ID, TEXT_MAX, ProtocolError, clip, short_str, uint, unpack_array

T = TypeVar("T")

_CHECK = "check"
#: Metadata key of a free-text field: the bytes the message's other fields take at most.
_OVERHEAD = "overhead"


@dataclass
class Message(RNS.MessageBase):
    """``pack``: ``[field, ...]``; ``unpack``: an array of exactly as many
    items, each checked by its field (ProtocolError on the first that fails)."""

    def __post_init__(self) -> None:
        for name, _ in self._free_text():
            setattr(self, name, clip(getattr(self, name)))

    def pack(self) -> bytes:
        return msgpack.packb([getattr(self, f.name) for f in fields(self)], use_bin_type=True)

    def unpack(self, raw: bytes) -> None:
        declared = fields(self)
        for f, value in zip(declared, unpack_array(raw, len(declared))):
            setattr(self, f.name, f.metadata[_CHECK](value))

    def fit(self, limit: int) -> Self:
        """This message with its free text (``free_text`` fields) cut so that it
        fits ``limit`` bytes (ChannelRouter.send asks this of one too large for
        the Link); the same message when it has none."""
        return replace(self, **{name: clip(getattr(self, name), max(16, limit - overhead))
                                for name, overhead in self._free_text()})

    def _free_text(self) -> list[tuple[str, int]]:
        return [(f.name, f.metadata[_OVERHEAD]) for f in fields(self) if _OVERHEAD in f.metadata]


def checked(check: Callable[[Any], T], default: T) -> T:
    """A field of immutable ``default`` that unpack passes through ``check(value)``."""
    return field(default=default, metadata={_CHECK: check})


def checked_new(check: Callable[[Any], T], factory: Callable[[], T]) -> T:
    """A field made by ``factory()`` (a list, a map) that unpack passes through ``check(value)``."""
    return field(default_factory=factory, metadata={_CHECK: check})


def uint_field(what: str, hi: int = MAX_ID) -> int:
    """An unsigned integer up to ``hi`` (default 0); ``what`` names it in the error."""
    return checked(lambda value: uint(value, what, hi), 0)


def text_field(what: str, limit: int = TEXT_MAX) -> str:
    """A string (default ""), cut to ``limit`` UTF-8 bytes when it arrives (links/channel.py TEXT_MAX says why)."""
    return checked(lambda value: short_str(value, what, limit), "")


def free_text(overhead: int) -> str:
    """A message's free text (default ""), named "message" in errors: cut to
    TEXT_MAX bytes when the message is made and when it arrives, and by
    ``fit(limit)`` to what ``limit`` leaves after ``overhead`` bytes (the other
    fields' most)."""
    return field(default="", metadata={_CHECK: lambda value: short_str(value, "message"), _OVERHEAD: overhead})


def bytes_field(what: str) -> bytes:
    """Bytes (default b""); ProtocolError "<what> is not bytes" otherwise."""
    def check(value: object) -> bytes:
        if not isinstance(value, bytes):
            raise ProtocolError(f"{what} is not bytes")
        return value
    return checked(check, b"")


def map_field(error: str) -> dict[str, Any]:
    """A map (default {}); ProtocolError(``error``) for anything else."""
    def check(value: object) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise ProtocolError(error)
        return value
    return checked_new(check, dict)
