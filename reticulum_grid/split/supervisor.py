"""Tower side of a split model: a llama-server whose RPC devices are the workers' memory, watched.

The coordinator runs the model in its own runner (inference/runner.py) with
``--rpc`` naming one local endpoint per worker (a tunnel or a data-plane
connection to that worker's ggml-rpc-server). llama.cpp puts layers on its
devices in order, RPC devices first: on a GPU coordinator the workers hold
the first layers and its own GPU the last ones and the output layer; on a
CPU coordinator (the CPU is no device in that list) its CPU holds the first
layers, the workers the rest, and a tensor override keeps the output layer
(and the final norm) in its host memory. Either way the logits (n_vocab x 4
bytes a token) never cross the network.

llama.cpp's RPC client aborts its process when a peer fails and sets no
socket timeouts, so the runner is a child the tower watches: a dead runner
ends the request with ``unreachable``; a frozen one (no event for FREEZE_S
during a generation) with ``timeout``; a load during which no byte crossed
the tunnels for LOAD_QUIET_S is stuck. The split runner is not restarted by
itself: the next request builds a new plan's model.
"""

import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Self

from links.wire import Code, WireError
from reticulum_grid.inference import generation
from reticulum_grid.inference.placement import LoadError
from reticulum_grid.inference.request import InferenceRequest
from reticulum_grid.inference.runner import Runner, RunnerError
from reticulum_grid.inference.runner_spec import RunnerSpec
from reticulum_grid.split import experts, speculation, tensor

log = logging.getLogger("rngrid.split")

#: Longest a generation may go without an event from the runner (seconds). A
#: worker that stops answering (frozen, or its Link gone quiet) shows up here.
FREEZE_S = 20.0
#: Longest a split model may take to load: weights cross the tunnels (seconds).
LOAD_TIMEOUT_S = 3600.0
#: A load during which no byte crosses the tunnels for this long is stuck (seconds).
#: Between its bursts of weights the coordinator loads and repacks its own layers
#: and runs llama-server's warm-up, which took over 30 s on a busy 2-core tower (a
#: false "stuck" fails a good plan three times over); a worker whose RPC server
#: never answers the first HELLO (it serves one client at a time) is only found
#: by this bound, and the client's next plan must still come within its 180 s.
LOAD_QUIET_S = 60.0
#: Tensors of a CPU coordinator's output layer, kept in its host memory.
OUTPUT_ON_CPU = r"^(output|output_norm|token_embd)\.weight$=CPU"


def layout(counts: Sequence[int], endpoints: Sequence[str], coordinator_gpu: bool, expert_mode: bool = False,
           path: object = None) -> tuple[int, tuple[float, ...], tuple[str, ...]]:
    """(n_gpu_layers, tensor_split, overrides) for a runner holding a model
    split as ``counts`` (layers per part: workers in order, the coordinator
    last) over the RPC ``endpoints`` (one per worker), in layers or (``expert_mode``) experts."""
    workers, own = list(counts[:-1]), counts[-1]
    if expert_mode:
        bufts = [experts.rpc_buffer_type(e) for e in endpoints]
        rules = [f"{pattern}={buft}" for pattern, buft in experts.overrides(path, counts, bufts)]
        return (999 if coordinator_gpu else 0), (), tuple(rules)
    if coordinator_gpu:  # devices: the workers' RPC devices, then this GPU (the output layer's)
        return 999, tuple(float(c) for c in workers) + (float(own + 1),), ()
    return sum(workers) + 1, tuple(float(c) for c in workers[:-1]) + (float(workers[-1] + 1),), (OUTPUT_ON_CPU,)


def naming_worker(key: bytes, message: str) -> str:
    """An error ``message`` about the worker tower at destination ``key``, as a
    coordinator sends it (named_worker reads the tower back)."""
    return f"worker tower {key.hex()}: {message}"


_NAMED = re.compile(r"worker tower ([0-9a-f]{32}): ")


def named_worker(message: str) -> bytes | None:
    """The destination hash of the worker tower an error message is about (naming_worker), or None."""
    found = _NAMED.search(message)
    return bytes.fromhex(found.group(1)) if found else None


class SplitOutOfMemory(WireError):
    """The split model did not load for want of memory: on the worker behind
    RPC ``endpoint``, or ("") on this tower. Code insufficient_memory."""

    def __init__(self, endpoint: str, message: str) -> None:
        super().__init__(Code.INSUFFICIENT_MEMORY, message)
        self.endpoint = endpoint


def worker_blocks(counts: Sequence[int], coordinator_gpu: bool) -> list[tuple[int, int]]:
    """[first, end) of the llama.cpp blocks (``blk.N``) each worker holds under
    ``layout``: a GPU coordinator's workers hold the first blocks in order; a
    CPU coordinator keeps the first blocks and its workers hold the last ones."""
    workers = list(counts[:-1])
    first = 0 if coordinator_gpu else sum(counts) - sum(workers)
    out = []
    for count in workers:
        out.append((first, first + count))
        first += count
    return out


class SplitModel:
    """A model split over RPC ``endpoints`` (``counts`` layers each, in order;
    the rest on this tower) by ``strategy`` (plan.STRATEGIES: "experts" puts
    the workers' share of expert tensors on them; "tensor" splits every
    layer by ``counts`` as shares over the endpoints and this tower's GPU,
    a CPU tower's own share being its last endpoint). ``key`` identifies the plan it was built for;
    ``gpu``: this tower's own llama.cpp device ("CUDA0"; "" on a CPU tower);
    ``draft``: a small model's path for speculative decoding, run whole on
    this tower (each round trip to the workers then verifies several tokens),
    proposing up to ``draft_max`` tokens at a time (split/speculation.py; 0:
    llama.cpp's default) and stopping at an unsure one (speculation.P_MIN)."""

    def __init__(self, key: object, path: str | os.PathLike[str], n_ctx: int, endpoints: Sequence[str],
                 counts: Sequence[int], log_path: Path, threads: int = 0, strategy: str = "pipeline", gpu: str = "",
                 draft: str = "", draft_max: int = 0, freeze_s: float = FREEZE_S) -> None:
        devices: tuple[str, ...] = ()
        overrides: tuple[str, ...] = ()
        if strategy == "tensor":
            ngl, split, devices = 999, tuple(float(c) for c in counts), tensor.devices(endpoints, gpu)
        else:
            ngl, split, overrides = layout(counts, endpoints, bool(gpu), strategy == "experts", path)
        self.key = key
        self.spec = RunnerSpec(str(path), n_ctx=n_ctx, parallel=1, n_gpu_layers=ngl, threads=threads,
                               tensor_split=split, rpc=tuple(endpoints), overrides=overrides, draft=draft,
                               split_mode="tensor" if strategy == "tensor" else "", devices=devices,
                               draft_device=gpu or "none", draft_max=draft_max,
                               draft_p_min=speculation.P_MIN if draft else 0.0)
        self.runner = Runner(self.spec, log_path, name="split", restart=False, stream_timeout_s=freeze_s)
        self.freeze_s = freeze_s

    def start(self, timeout: float = LOAD_TIMEOUT_S, moved: Callable[[], int] | None = None,
              quiet_s: float = LOAD_QUIET_S) -> Self:
        """Start the runner and wait for it to load. ``moved()``: bytes the
        model's tunnels carried so far; a load that moves none for ``quiet_s``
        seconds is stuck (RPC has no timeouts of its own). Raises WireError
        (SplitOutOfMemory when an allocation failed)."""
        try:
            self.runner.start(timeout, progress=moved, quiet_s=quiet_s)
        except LoadError as e:
            self.close()
            if e.stuck:
                raise WireError(Code.TIMEOUT, f"a shard stopped answering while loading the split model "
                                              f"(nothing for {quiet_s:.0f} s); the split model was stopped") from None
            if e.out_of_memory:
                raise SplitOutOfMemory(self._endpoint_of(e.buffer), f"the split model did not load: {e}") from None
            refused = tensor.refused_architecture(self.runner.log_text())
            if refused is not None and self.spec.split_mode == "tensor":
                raise WireError(Code.UNSUPPORTED, f"llama.cpp's tensor split mode does not support architecture "
                                                  f"{refused!r}: ask for pipeline or experts placement") from None
            raise WireError(Code.UNREACHABLE, f"the split model did not load: {e}") from None
        log.info("split model up: %s", self.weights_mib)
        return self

    def _endpoint_of(self, buffer: str) -> str:
        """The RPC endpoint llama.cpp's buffer name points at ("RPC0[127.0.0.1:50052]"), "" for a local one."""
        return next((e for e in self.spec.rpc if buffer.endswith(f"[{e}]")), "")

    @property
    def alive(self) -> bool:
        return self.runner.alive

    @property
    def weights_mib(self) -> dict[str, float]:
        """llama.cpp's own account: {buffer: MiB of weights} (RPC buffers are the workers')."""
        placement = self.runner.placement
        return {b: mib for (b, kind), mib in placement.buffers.items() if kind == "model"} if placement else {}

    def generate(self, request: InferenceRequest, cancel: threading.Event,
                 result: generation.Generation) -> Iterator[generation.Piece]:
        """Yield generation.Piece, filling ``result``. Raises WireError."""
        try:
            yield from generation.generate(self.runner, request, cancel, result)
        except RunnerError as e:
            self.close()
            if e.kind == "timeout":
                raise WireError(Code.TIMEOUT, f"a shard stopped answering while generating (nothing for "
                                              f"{self.freeze_s:.0f} s); the split model was stopped") from None
            raise WireError(Code.UNREACHABLE, f"the split model process ended ({e.message}): a shard tower "
                                              "went away") from None

    def close(self) -> None:
        self.runner.close()
