"""A tower's model commands (role ``infer``): ``ai/inference`` and ``ai/embeddings``.

``ai/inference`` (inference/request.py) -> ``{"stream_id", "queued"}`` at once,
then the token stream (links/stream.py) from the model's runner; a request
with a ``split`` plan goes to tower/split.py.

``ai/embeddings`` ``{"model", "input": str | [str, ...], "stream_id"}`` ->
``{"stream_id", "queued"}``, then one stream whose chunks carry the vectors
as float32 little-endian bytes, one vector after another, and whose end
message's usage says ``dims``, ``count`` and ``prompt_tokens``. The runner
is started with embeddings on (``[models.X] embeddings = true``) or
restarted so on first use; the vectors are llama.cpp's, normalised (L2).
"""

import struct
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from links.commands import Command, bind
from links.wire import Code, WireError
from links.usage import EmbeddingsUsage, StreamUsage
from reticulum_grid.inference import generation, request as inference_request
from reticulum_grid.inference.generation import Generation, Piece
from reticulum_grid.inference.runner import Runner
from reticulum_grid.tower.streams import start_stream

if TYPE_CHECKING:
    from reticulum_grid.tower.session import LinkSession
    from reticulum_grid.tower.parts import TowerParts

#: Bytes of vectors per stream piece (the sender cuts pieces to the Link's MDU anyway).
VECTOR_PIECE_BYTES = 16384


class TowerInference:
    def __init__(self, tower: "TowerParts") -> None:
        self.tower = tower

    def commands(self) -> list[Command]:
        return [bind("ai/inference", self.inference), bind("ai/embeddings", self.embeddings)]

    def inference(self, session: "LinkSession", request: dict[str, Any]) -> dict[str, Any]:
        if "split" in request:  # a model split over towers (tower/split.py)
            return self.tower.split.inference(session, request)
        parsed = inference_request.parse(request)
        registry = self.tower.registry
        slot = registry.find(parsed.model)
        adapter = self.adapter_path(parsed.adapter)

        def prepare() -> Runner:
            # Loading, or a restart for an adapter, waits for the running streams: off the handler.
            return registry.runner(slot, adapter)

        def generate(runner: Runner, result: Generation, cancel: threading.Event) -> Iterator[Piece]:
            lora = [{"id": i, "scale": parsed.adapter_scale if path == adapter else 0.0}
                    for i, path in enumerate(slot.adapters)]
            yield from generation.generate(runner, parsed, cancel, result, lora)

        return start_stream(session, parsed, slot.queue, generate, self._whole_model_usage, prepare=prepare,
                            budget=parsed.sampling.max_tokens)

    def embeddings(self, session: "LinkSession", request: dict[str, Any]) -> dict[str, Any]:
        model, texts, stream_id = inference_request.parse_embeddings(request)
        registry = self.tower.registry
        slot = registry.find(model)
        job = _EmbeddingJob(stream_id, texts)

        def generate(runner: Runner, result: Generation, cancel: threading.Event) -> Iterator[Piece]:
            reply = runner.call("POST", "/v1/embeddings", {"input": texts})
            vectors = [d["embedding"] for d in sorted(reply["data"], key=lambda d: d["index"])]
            data = b"".join(struct.pack(f"<{len(v)}f", *v) for v in vectors)
            for i in range(0, len(data), VECTOR_PIECE_BYTES):
                if cancel.is_set():
                    result.finish_reason = "cancelled"
                    return
                yield Piece(data[i:i + VECTOR_PIECE_BYTES], [], 0)
            result.prompt_tokens = int((reply.get("usage") or {}).get("prompt_tokens", 0))
            result.finish_reason = "stop"
            result.extra.update(dims=len(vectors[0]) if vectors else 0, count=len(vectors))

        return start_stream(session, job, slot.queue, generate, self._embeddings_usage,
                            prepare=lambda: registry.runner(slot, embeddings=True), name="rngrid-embed")

    def _embeddings_usage(self, result: Generation, queued_s: float) -> dict[str, Any]:
        """The usage map of an embeddings stream: its usage, and the vectors' ``dims`` and ``count``."""
        return EmbeddingsUsage(usage=self.usage(result, queued_s), dims=result.extra.get("dims", 0),
                               count=result.extra.get("count", 0)).to_map()

    def adapter_path(self, name: str | None) -> str | None:
        """The path of the GGUF LoRA adapter ``name`` (None for none). Raises WireError(unknown_adapter)."""
        if not name:
            return None
        store = self.tower.store
        try:
            info = store.info(store.resolve(name))
        except WireError:
            info = None
        if info is None or info.kind != "adapter":
            raise WireError(Code.UNKNOWN_ADAPTER, f"no GGUF LoRA adapter {name!r} on tower {self.tower.config.name}")
        return str(info.path)

    def _whole_model_usage(self, result: Generation, queued_s: float) -> dict[str, Any]:
        if result.completion_tokens:  # announced: what this tower's model runs at
            self.tower.record_tokens_per_s(result.tokens_per_s)
        return self.usage(result, queued_s).to_map()

    def usage(self, result: Generation, queued_s: float) -> StreamUsage:
        """A stream's usage from what its generation measured (links/usage.py)."""
        return result.usage(queued_s, self.tower.config.name)


class _EmbeddingJob:
    """What start_stream needs of an embeddings request."""

    def __init__(self, stream_id: int, texts: list[str]) -> None:
        self.stream_id, self.texts = stream_id, texts
