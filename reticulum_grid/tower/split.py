"""Split inference on a tower (reticulum_grid.split): the coordinator end.

An ``ai/inference`` request with a ``split`` plan (the client planned it, see
split/plan.py) runs on a split model in a child process, its first layers on
the plan's workers (their end: tower/shard.py), reached through tunnels over
Links this tower opens (identified with its own identity), each proven with
llama.cpp's HELLO before the model loads. Layers are this tower's model: it
sends them only to workers whose tower identity holds ``shard`` on it too
(towers that split models together grant each other ``shard``), whoever
planned the split. The stream goes to the client through the usual token
stream: stop strings, usage, cancel and continue_tokens work as for a whole
model. A split model that does not load for want of memory ends the stream
with insufficient_memory, naming the worker tower whose RPC buffer llama.cpp
could not allocate (split/supervisor.py naming_worker; none named: this
tower's own), so the client believes that tower lends less (client/split.py).
``split/probe`` measures this tower's round trips to other towers.

``split`` request field::

    {"parts": [{"key": worker destination hash (16 bytes), "first": int, "end": int}, ...,
               {"key": this tower's destination hash, "first": int, "end": n_layers}],
     "strategy": "pipeline" | "experts" | "tensor",   # split/plan.py STRATEGIES (default pipeline)
     "experts": bool}     # the same as strategy "experts" (MoE: expert tensors on the workers, the rest here)

Under "tensor" the parts' layer counts are each tower's share of every layer
(split/tensor.py); a CPU coordinator lends its own RPC server to its share
(tower/shard.py lend_to_self).
"""

import logging
import os
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from links.channel import ChannelRouter
from links.commands import Command, bind
from links.wire import LINK_LOST, Code, Field, WireError, max_len, validate
from reticulum_grid.inference import request as inference_request
from reticulum_grid.inference.admission import ModelQueue
from reticulum_grid.inference.generation import Generation, Piece
from reticulum_grid.inference.registry import ModelSlot
from reticulum_grid.node.connection import TowerConnection
from reticulum_grid.node.dataplane import Forwarder
from reticulum_grid.split import direct, estimate, experts, speculation
from reticulum_grid.store import gguf_info
from reticulum_grid.split.plan import STRATEGIES
from reticulum_grid.split.probe import LinkProbe
from reticulum_grid.split.rpcworker import hello, round_trip
from reticulum_grid.split.supervisor import SplitModel, SplitOutOfMemory, naming_worker, worker_blocks
from reticulum_grid.split.tunnel import TunnelListener, Tunnels
from reticulum_grid.tower.streams import start_stream

if TYPE_CHECKING:
    from reticulum_grid.tower.session import LinkSession
    from reticulum_grid.tower.parts import TowerParts

log = logging.getLogger("rngrid.tower.split")

MAX_PARTS = 8
#: One part of a split plan: (the tower's destination hash, its first layer, the layer after its last).
Part = tuple[bytes, int, int]
#: What a split model is built for: (the model's blob id, the plan's parts, its strategy).
Want = tuple[bytes, tuple[Part, ...], str]
#: Longest a coordinator waits for a worker to seed its tensor cache before loading anyway (seconds).
SEED_WAIT_S = 300.0
#: How often it asks (seconds).
SEED_POLL_S = 0.25
#: How long one ask may take: the worker answers at once (seconds).
SEED_ASK_S = 5.0
#: How long a coordinator waits for the HELLO reply through a new tunnel before it links again (seconds).
PROVE_S = 10.0
#: Links a coordinator makes to one worker for one plan before it gives up on that worker.
LINK_TRIES = 2
#: RPC round trips it times through a proven link, and the seconds they may take together (at least one is
#: timed): their median is the worker's rpc_rtt (split/probe.py). The median, because a crossing during decoding
#: meets the relays as often late as early; nine take ~10 ms on a LAN, 0.4 s on a 40 ms tailnet.
RPC_PINGS = 9
RPC_PINGS_S = 1.0


class TowerSplit:
    def __init__(self, tower: "TowerParts") -> None:
        self.tower = tower
        self.queue = ModelQueue(tower.config.queue_depth)
        self.probe = LinkProbe(tower.identity)
        self.model: SplitModel | None = None
        # (TowerConnection, TunnelListener or Forwarder) of the loaded split model
        self.links: list[tuple[TowerConnection, Forwarder | TunnelListener | None]] = []
        # this tower's own RPC server for its share of a tensor split (a CPU tower), and what ends that loan
        self.own_share: tuple[Forwarder, Callable[[], None]] | None = None
        self._lock = threading.Lock()

    def commands(self) -> list[Command]:
        return [bind("split/probe", self.probe_links)]

    def probe_links(self, session: "LinkSession", request: dict[str, Any]) -> dict[str, Any]:
        """split/probe (split/probe.py): this tower's round trips to other towers."""
        towers = validate(request, {"towers": Field(list, required=True, check=max_len(2 * MAX_PARTS))})["towers"]
        if any(not isinstance(t, bytes) or len(t) != 16 for t in towers):
            raise WireError(Code.BAD_REQUEST, "towers must list destination hashes (16 bytes)")
        rtts, pending, refused = self.probe.ask([t for t in towers if t != self.tower.destination.hash])
        return {"rtts": {k.hex(): round(v, 5) for k, v in rtts.items()}, "pending": [k.hex() for k in pending],
                "refused": [k.hex() for k in refused],
                "rates": {k.hex(): round(v) for k, v in self.probe.rates.items() if k in towers},
                "rpc_rtts": {k.hex(): round(v, 6) for k, v in self.probe.rpc_rtts.items() if k in towers}}

    def stop(self) -> None:
        self._drop_model()
        self.probe.close()

    # -- coordinator end --------------------------------------------------
    def inference(self, session: "LinkSession", request: dict[str, Any]) -> dict[str, Any]:
        split = request.pop("split")
        parsed = inference_request.parse(request)
        if parsed.adapter:
            raise WireError(Code.UNSUPPORTED, "a split model runs without LoRA adapters")
        slot = self.tower.registry.find(parsed.model)
        parts = self._parse_parts(split, gguf_info.facts(slot.path).blocks)
        strategy = split.get("strategy", "experts" if split.get("experts") is True else "pipeline")
        if strategy not in STRATEGIES:
            raise WireError(Code.BAD_REQUEST, f"split.strategy must be one of {', '.join(STRATEGIES)}")
        want = (slot.blob_id, tuple(parts), strategy)

        def generate(model: SplitModel, result: Generation, cancel: threading.Event) -> Iterator[Piece]:
            yield from model.generate(parsed, cancel, result)

        def usage(result: Generation, queued_s: float) -> dict[str, Any]:
            return replace(self.tower.inference.usage(result, queued_s),
                           split=tuple(key.hex() for key, _, _ in parts)).to_map()

        return start_stream(session, parsed, self.queue, generate, usage, prepare=lambda: self._ensure_model(
            slot, want), on_error=self._stream_failed, name="rngrid-split", budget=parsed.sampling.max_tokens)

    def _parse_parts(self, split: object, n_layers: int) -> list[Part]:
        parts = split.get("parts") if isinstance(split, dict) else None
        if not isinstance(parts, list) or not 1 <= len(parts) <= MAX_PARTS:
            raise WireError(Code.BAD_REQUEST, f"split.parts must list 1..{MAX_PARTS} parts")
        out: list[Part] = []
        first = 0
        for part in parts:
            if not isinstance(part, dict) or not isinstance(part.get("key"), bytes) or len(part["key"]) != 16:
                raise WireError(Code.BAD_REQUEST, "each split part needs a 16-byte destination hash 'key'")
            if part.get("first") != first or not isinstance(part.get("end"), int) or part["end"] <= first:
                raise WireError(Code.BAD_REQUEST, "split parts must cover the layers in order, from 0")
            out.append((part["key"], first, part["end"]))
            first = part["end"]
        if first != n_layers:
            raise WireError(Code.BAD_REQUEST, f"split parts cover {first} layers; the model has {n_layers}")
        if out[-1][0] != self.tower.destination.hash:
            raise WireError(Code.BAD_REQUEST, "the last split part must be this tower (the coordinator)")
        if len({key for key, _, _ in out}) != len(out):
            raise WireError(Code.BAD_REQUEST, "a tower appears twice in the split plan")
        return out

    def _ensure_model(self, slot: ModelSlot, want: Want) -> SplitModel:
        """The split model for ``want`` (blob, parts, experts), built if needed."""
        with self._lock:
            try:
                self.tower.registry.verify(slot)
            except WireError:
                if self.model is not None and self.model.spec.path == slot.path:
                    self._drop_model()  # its runner has the changed file open
                raise
            if self.model is not None and self.model.key == want and self.model.alive and all(
                    c.link is not None and cast(ChannelRouter, c.router).link_usable() for c, _ in self.links):
                return self.model
            self._drop_model()
            _, parts, strategy = want
            if strategy == "experts" and not experts.has_experts(slot.path):
                raise WireError(Code.BAD_REQUEST, "expert placement needs a model with expert tensors")
            try:
                self.model = self._build(slot, want, parts, strategy)
            except BaseException:
                self._drop_model()  # the Links and tunnels made so far
                raise
            return self.model

    def _build(self, slot: ModelSlot, want: Want, parts: tuple[Part, ...], strategy: str) -> SplitModel:
        # The tunnel listeners accept the split model's own connections only (tunnel.py).
        building: dict[str, SplitModel] = {}

        def owners() -> list[int]:  # the split runner's llama-server (under its guard); this tower while it proves a link
            model = building.get("model")
            pid = model.runner.pid if model is not None else None
            return [pid] if pid else [os.getpid()]

        endpoints: list[str] = []
        counts = [end - first for _, first, end in parts]
        blocks = worker_blocks(counts, bool(self._own_gpu()))
        for (key, _, _), held in zip(parts[:-1], blocks):  # only a pipeline's shares are whole blocks to seed
            self._check_worker(key)
            endpoints.append(self._link_worker(key, slot.blob_id, held if strategy == "pipeline" else None, owners))
        if strategy == "tensor" and not self._own_gpu():  # llama.cpp's meta device takes no CPU: lend this one's RPC
            self.own_share = self.tower.shard.lend_to_self(owners)
            endpoints.append(self.own_share[0].endpoint)
        draft = self.draft_for(slot)
        model = building["model"] = SplitModel(want, slot.path, self.tower.registry.n_ctx(slot), endpoints, counts,
                                               self.tower.config.directory / "split-model.log",
                                               threads=slot.settings.threads, strategy=strategy,
                                               gpu=self._own_gpu(), draft=draft,
                                               draft_max=self._draft_max(draft, [key for key, _, _ in parts[:-1]]))
        started = time.perf_counter()
        try:
            model.start(moved=lambda: sum(_moved(carrier) for _, carrier in self.links))
        except SplitOutOfMemory as e:  # the client marks what the tower that lacked memory claims to lend
            worker = next((key for (key, _, _), endpoint in zip(parts, endpoints) if endpoint == e.endpoint), None)
            raise WireError(e.code, naming_worker(worker, e.message) if worker else e.message) from None
        seconds = time.perf_counter() - started
        for (key, _, _), (_, carrier) in zip(parts, self.links):
            self.probe.record_rate(key, _moved(carrier), seconds)
        log.info("split model loaded in %.2f s over %d worker(s); %d bytes crossed to and from them",
                 seconds, len(endpoints), sum(_moved(l) for _, l in self.links))
        return model

    def _link_worker(self, key: bytes, blob_id: bytes, seed: tuple[int, int] | None,
                     owners: Callable[[], list[int]]) -> str:
        """The endpoint of a proven link (LINK_TRIES at most) to the worker at ``key``, asked first to seed its
        tensor cache with the blocks ``seed`` of the model ``blob_id`` (None: a share of no whole blocks); the
        RPC round trip timed through it is recorded. Raises WireError (unreachable)."""
        for attempt in range(1, LINK_TRIES + 1):
            conn = TowerConnection(self.tower.identity, key, key.hex()[:16])
            self.links.append((conn, None))
            if seed is not None and attempt == 1:
                _await_seed(conn, blob_id, seed)
            listener = self._tunnel_to(key, conn, owners)
            self.links[-1] = (conn, listener)
            proven, rpc_rtt = _prove(listener.endpoint)
            if proven:
                if rpc_rtt is not None:  # what the next plan costs this worker's crossings with (split/strategy.py)
                    self.probe.record_rpc_rtt(key, rpc_rtt)
                log.info("split worker %s: RPC %s%s", key.hex()[:16],
                         "over the data plane" if isinstance(listener, Forwarder) else "through the RNS tunnel",
                         f", its round trip {rpc_rtt * 1000:.2f} ms" if rpc_rtt is not None else "")
                return listener.endpoint
            log.warning("split worker %s: no HELLO reply through the %s within %.0f s (try %d of %d)",
                        key.hex()[:16], _carrier(listener), PROVE_S, attempt, LINK_TRIES)
            self.links.pop()
            listener.close()
            conn.close()
        raise WireError(Code.UNREACHABLE, naming_worker(key, f"its RPC server's HELLO reply did not come "
                                                            f"back through the {_carrier(listener)}"))

    def _tunnel_to(self, key: bytes, conn: TowerConnection,
                   owners: Callable[[], list[int]]) -> Forwarder | TunnelListener:
        """shard/tunnel on the worker at ``key`` over ``conn``, and the local
        end its RPC bytes take (a data-plane Forwarder or an RNS tunnel)."""
        own = self.tower.config.dataplane
        try:
            reply = conn.request("shard/tunnel", {"dataplane": own} if own else {}, timeout=15.0)
        except WireError as e:
            raise WireError(e.code, naming_worker(key, e.message)) from None
        # conn.request set up the Link (and its router).
        return direct.forwarder(reply, owners) or TunnelListener(Tunnels(cast(ChannelRouter, conn.router)), owners)

    def _own_gpu(self) -> str:
        """This tower's first GPU as llama.cpp names it ("CUDA0"), "" on a CPU tower."""
        from reticulum_grid.node import hardware
        return hardware.first_gpu_name() if self.tower.hardware().backend != "cpu" else ""

    def draft_for(self, slot: ModelSlot) -> str:
        """The draft model's path for ``slot``'s split model: ``[models.X] draft``,
        else the smallest model this tower holds with the same vocabulary at a
        quarter of the size or less (gguf_info.vocabulary_id); "" for none."""
        registry = self.tower.registry
        if slot.settings.draft:
            return registry.find(slot.settings.draft).path
        try:
            vocabulary = gguf_info.vocabulary_id(slot.path)
        except Exception:  # an unreadable model gets no draft; its load reports the problem
            return ""
        candidates = []
        for blob_id in set(registry.aliases().values()):
            other = registry.slot(blob_id)
            if other is slot or other.size * 4 > slot.size:
                continue
            try:
                if gguf_info.vocabulary_id(other.path) == vocabulary:
                    candidates.append(other)
            except Exception:
                continue
        return min(candidates, key=lambda s: s.size).path if candidates else ""

    def _draft_max(self, draft: str, workers: list[bytes]) -> int:
        """Tokens the draft at path ``draft`` proposes a verification ahead of
        ``workers`` (their latest RTTs, split/speculation.py); 0 without a draft."""
        if not draft:
            return 0
        rtt = max((self.probe.last_rtt(key) or 0.0 for key in workers), default=0.0)
        ahead = speculation.draft_max(rtt, os.path.getsize(draft), estimate.bandwidth(self.tower.hardware().backend))
        log.info("split draft: up to %d tokens a verification (workers' RTT %.1f ms)", ahead, rtt * 1000)
        return ahead

    def _check_worker(self, key: bytes) -> None:
        """Raise WireError(not_allowed) unless the tower at destination ``key`` is
        trusted here with ``shard`` (it would receive this tower's layers)."""
        self.tower.allow.check_tower(key, "shard", self.tower.config.name, "to hold layers of its models")

    def _drop_model(self) -> None:
        if self.model is not None:
            self.model.close()
            self.model = None
        for conn, listener in self.links:
            if listener is not None:
                listener.close()
            conn.close()
        self.links = []
        if self.own_share is not None:
            self.own_share[1]()
            self.own_share = None

    def _stream_failed(self, error: WireError) -> None:
        log.info("split stream failed: %s", error)
        if error.code in LINK_LOST | {Code.RUNNER_LOST}:  # a worker went away: rebuild next time
            with self._lock:
                self._drop_model()


def _await_seed(conn: TowerConnection, blob_id: bytes, blocks: tuple[int, int]) -> None:
    """Ask the worker behind ``conn`` to seed its tensor cache with ``blocks``
    of the model and wait (SEED_WAIT_S at most) until it has; a worker that
    cannot (without the model; an older one, which lets the request time out
    after SEED_ASK_S) just gets the weights sent. Raises WireError
    (unreachable) when the worker cannot be reached at all."""
    try:
        conn.ensure_link()
    except WireError as e:
        raise WireError(e.code, f"worker tower {conn.destination_hash.hex()}: {e.message}") from None
    deadline = time.monotonic() + SEED_WAIT_S
    ask: dict[str, Any] = {"blob": blob_id, "blocks": list(blocks)}
    while True:
        try:
            reply = conn.request("shard/seed", ask, timeout=SEED_ASK_S)
            ask["poll"] = True
        except WireError as e:
            log.info("worker %s seeds no tensor cache: %s", conn.name, e.message)
            return
        if reply.get("state") != "seeding" or time.monotonic() > deadline:
            log.info("worker %s tensor cache: %s", conn.name, reply)
            return
        time.sleep(SEED_POLL_S)


def _prove(endpoint: str) -> tuple[bool, float | None]:
    """(True when llama.cpp's HELLO through a worker's tunnel or forwarder at
    ``endpoint`` ("127.0.0.1:port") is answered within PROVE_S: the whole way
    to its RPC server and back carries bytes (a Link that took the request but
    not its Channel's replies once stalled a load for its whole 60 s bound);
    the RPC round trip that way then (_rpc_rtt), or None)."""
    host, port = endpoint.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=PROVE_S) as sock:
            return (True, _rpc_rtt(sock)) if hello(sock) else (False, None)
    except OSError:
        return False, None


def _rpc_rtt(sock: socket.socket) -> float | None:
    """The median seconds of RPC_PINGS round trips on ``sock`` (fewer when they
    outlast RPC_PINGS_S, as on a slow tunnel); None when one went unanswered."""
    times: list[float] = []
    deadline = time.monotonic() + RPC_PINGS_S
    try:
        while len(times) < RPC_PINGS and (not times or time.monotonic() < deadline):
            took = round_trip(sock)
            if took is None:
                return None
            times.append(took)
    except OSError:
        return None
    return statistics.median(times)


def _carrier(listener: Forwarder | TunnelListener) -> str:
    return "data plane" if isinstance(listener, Forwarder) else "RNS tunnel"


def _moved(listener: Forwarder | TunnelListener | None) -> int:
    """direct.moved of a built split model's link: each has its listener by then."""
    return direct.moved(cast("Forwarder | TunnelListener", listener))
