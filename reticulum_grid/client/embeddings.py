"""``ai/embeddings`` on the grid: routed like inference, the vectors back as one stream.

The request goes to the best ranked tower holding the model (router.py); one
that refuses or fails is skipped and the next one asked (an embedding is the
same wherever it is computed, so a whole request is simply asked again). The
tower streams the vectors as float32 little-endian bytes (tower/inference.py).
"""

import secrets
import struct
from dataclasses import dataclass
from collections.abc import Iterable
from typing import cast

import RNS

from announce.table import TowerEntry

from links.stream import MAX_STREAM_ID, TokenEvent
from links.usage import EmbeddingsUsage, decode_usage
from links.wire import Code, WireError
from reticulum_grid.client.busy import BusyWait
from reticulum_grid.client.parts import GridParts
from reticulum_grid.client.stream import MAX_TOWERS, RETRY_BEFORE_OUTPUT, STREAM_SILENCE_S



@dataclass
class Embeddings:
    """``vectors``: one list of floats per input text, in order (each of ``dims``
    numbers); ``prompt_tokens``: tokens the inputs took; ``tower``: who computed
    them; ``queued_s``: seconds the tower took before computing them (starting
    the model's runner, or restarting it with embeddings on, and waiting for a slot)."""
    vectors: list[list[float]]
    prompt_tokens: int
    tower: str
    queued_s: float = 0.0

    @property
    def dims(self) -> int:
        return len(self.vectors[0]) if self.vectors else 0


def embed(grid: GridParts, model: str, texts: str | Iterable[str], tower: str | None = None,
          busy_wait: BusyWait | None = None) -> Embeddings:
    """Embeddings of ``texts`` (a string or a list of them) from ``model``;
    ``busy_wait``: a busy.BusyWait for when every tower is busy. Raises
    WireError (the most telling code a tower gave)."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    while True:
        errors: list[tuple[TowerEntry, WireError]] = []
        for choice in grid.rank(model, tower=tower)[:MAX_TOWERS]:
            try:
                return _ask(grid, choice.entry, model, texts)
            except WireError as e:
                if e.code not in RETRY_BEFORE_OUTPUT:
                    raise
                errors.append((choice.entry, e))
                if e.code != Code.BUSY:
                    grid.liveness.failed(choice.entry, e)
        error = _exhausted(model, errors)
        others = {entry.destination_hash for entry, e in errors if e.code != Code.BUSY}
        if error.code != Code.BUSY or busy_wait is None or not busy_wait.wait(model, error, exclude=others):
            raise error


def _exhausted(model: str, errors: list[tuple[TowerEntry, WireError]]) -> WireError:
    tried = "; ".join(f"{entry.name}: {e.code}: {e.message}" for entry, e in errors) or "none"
    codes = [e.code for _, e in errors]
    busy = [e.retry_after for _, e in errors if e.code == Code.BUSY and e.retry_after is not None]
    return WireError(codes[0] if len(set(codes)) == 1 else Code.UNREACHABLE,
                     f"no tower could embed with {model!r}; tried {tried}", retry_after=min(busy, default=None))


def _ask(grid: GridParts, entry: TowerEntry, model: str, texts: list[str]) -> Embeddings:
    conn = grid.connection(entry)
    stream_id = secrets.randbelow(MAX_STREAM_ID)
    bound = grid.liveness.attempt_timeout(entry)
    receiver = conn.open_stream(stream_id, link_timeout=bound)
    try:
        conn.request("ai/embeddings", {"model": model, "input": texts, "stream_id": stream_id}, bound,
                     link_timeout=bound)
        data = bytearray()
        silence = max(STREAM_SILENCE_S, 10 * (cast(RNS.Link, conn.link).rtt or 0.0))  # open_stream set up the Link
        for event in receiver.events(silence, conn.router):
            if isinstance(event, TokenEvent):
                data += event.data
                continue
            end = decode_usage(event.usage, EmbeddingsUsage)
            dims, count = end.dims, end.count
            if count != len(texts) or dims * count * 4 != len(data) or not dims:
                raise WireError(Code.INTERNAL, f"tower {entry.name} sent {len(data)} bytes of vectors, "
                                               f"not {len(texts)} x {dims} float32")
            flat = struct.unpack(f"<{dims * count}f", bytes(data))
            vectors = [list(flat[i * dims:(i + 1) * dims]) for i in range(count)]
            return Embeddings(vectors, end.usage.prompt_tokens, entry.name, end.usage.queued_s)
    finally:
        conn.close_stream(stream_id)
    raise WireError(Code.INTERNAL, f"tower {entry.name} ended the embeddings stream without its end")
