"""Split inference on a tower (reticulum_grid.split): the worker end.

``shard/tunnel`` (role ``shard``) starts this tower's RPC server child (in a
network of its own, split/rpcworker.py), proves it answers, and lets the
calling Link carry tunnels to it (or a data-plane front, split/direct.py), for
one coordinator's plan at a time (split/lease.py: another gets ``busy``).
``shard/seed`` fills its tensor cache from this tower's own copy of the model,
so those weights need not cross (split/tensorcache.py). The coordinator end is
tower/split.py.

``shard/seed`` ``{"blob": blob id (32 bytes), "blocks": [first, end], "poll"?: bool}``
(the llama.cpp blocks the worker will hold; ``poll``: only report) -> ``{"state": "seeding" | "ready" |
"absent" | "busy" | "failed", "tensors": n, "bytes": written, "message"?}`` (busy:
another plan's seeding runs; one at a time); the
coordinator asks again while "seeding" (tower/split.py SEED_WAIT_S at most), then loads.
"""

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from announce.caps import Hardware

from links.commands import Command, bind
from links.wire import Code, Field, WireError, max_len, validate
from reticulum_grid.node import engine
from reticulum_grid.node.dataplane import Forwarder
from reticulum_grid.split import direct
from reticulum_grid.split.lease import Holder, RpcLease
from reticulum_grid.split.rpcworker import RpcUnavailable, RpcWorker
from reticulum_grid.split.tensorcache import TensorCache, block_tensors
from reticulum_grid.split.tunnel import Tunnels

if TYPE_CHECKING:
    from reticulum_grid.tower.session import LinkSession
    from reticulum_grid.tower.parts import TowerParts

log = logging.getLogger("rngrid.tower.shard")

#: Memory a tower keeps for itself when it lends the rest (MiB, or 10% of the total if more).
HEADROOM_MIB = 1024


class TowerShard:
    def __init__(self, tower: "TowerParts") -> None:
        self.tower = tower
        directory = tower.config.directory
        cache_mib = tower.config.shard_cache_mib
        self.cache = TensorCache(directory / "rpc-cache", bound=cache_mib << 20) if cache_mib else None
        #: (blob id, blocks) -> the state shard/seed reports for it
        self.seeding: dict[tuple[bytes, tuple[int, int]], dict[str, Any]] = {}
        self.worker = RpcWorker(directory / "rpc-worker.log", threads=tower.config.shard_threads,
                                lend_mib=self._cpu_lend_mib, cache=self.cache)
        self.lease = RpcLease(idle_s=tower.config.shard_yield_idle_s)
        self._seed_lock = threading.Lock()

    def commands(self) -> list[Command]:
        return [bind("shard/tunnel", self.tunnel), bind("shard/seed", self.seed)]

    def stop(self) -> None:
        self.worker.stop()

    def _cpu_lend_mib(self) -> int | None:
        """The RPC server's memory cap (MiB) on a CPU tower; None on a GPU tower."""
        hardware = self.tower.hardware()
        if hardware.backend != "cpu":
            return None
        return self.lend_mib(hardware) or None

    def lend_mib(self, hardware: Hardware) -> int:
        """MiB this tower lends to split models: free memory (VRAM, else RAM)
        minus a headroom, capped by ``[shard] lend_mib``; 0 without RPC."""
        if not engine.available(engine.RPC_SERVER):
            return 0
        spare = max(0, hardware.memory_free_mib - max(HEADROOM_MIB, hardware.memory_total_mib // 10))
        cap = self.tower.config.lend_mib
        return spare if cap is None else min(cap, spare)

    def tunnel(self, session: "LinkSession", request: dict[str, Any]) -> dict[str, Any]:
        """shard/tunnel: lend this tower's RPC server to the calling coordinator's
        plan, once it is free (split/lease.py) and answers a HELLO."""
        coordinator = validate(request, {"dataplane": Field(str, check=max_len(64))})["dataplane"]
        if not engine.available(engine.RPC_SERVER):
            raise WireError(Code.UNSUPPORTED, f"this tower has no {engine.RPC_SERVER}: run `make llama` there")
        identity = session.identity
        who = identity.hash if identity is not None else b""
        holder = Holder(session, who, who.hex()[:16] or "an unidentified tower", end=session.link.teardown,
                        last_active=lambda: _last_active(session))
        if self.lease.take(holder):
            session.on_close(lambda: self.lease.release(session))
            try:
                self.worker.ready()
            except RpcUnavailable as e:
                self.lease.release(session)
                raise WireError(Code.BUSY, str(e), retry_after=10.0) from None
        cache = self.cache
        if cache is not None:  # what a peer's misses wrote is never served to the next plan
            cache.clean(verify=False)
            session.on_close(lambda: cache.clean(verify=False))
        if session.tunnels is None:
            session.tunnels = Tunnels(session.router, target=self.worker.connect)
            session.on_close(session.tunnels.close_all)
        reply: dict[str, Any] = {"tower": self.tower.config.name}
        own = self.tower.config.dataplane
        if own and coordinator:  # the RPC bytes go straight over the data plane (direct.py)
            front, reply["dataplane"] = direct.offer(own, coordinator, self.worker.connect)
            session.fronts.append(front)
            session.on_close(front.close)
        return reply

    def lend_to_self(self, owners: Callable[[], list[int]]) -> tuple[Forwarder, Callable[[], None]]:
        """This tower's RPC server for its own tensor-parallel plan (a CPU
        tower's share of llama.cpp's meta device, split/tensor.py), leased as
        any coordinator leases it, reached through a loopback data-plane front
        (direct.py) whose forwarder admits ``owners()``'s processes only.
        Returns (the forwarder, a function that ends the loan). Raises
        WireError (unsupported without an RPC server, busy while another plan holds it)."""
        if not engine.available(engine.RPC_SERVER):
            raise WireError(Code.UNSUPPORTED, f"this tower has no {engine.RPC_SERVER} for its share of a tensor split")
        token = object()
        front, reply = direct.offer("127.0.0.1", "127.0.0.1", self.worker.connect)
        me = self.tower.identity.hash
        self.lease.take(Holder(token, me, "this tower's own tensor split", end=front.close,
                               last_active=lambda: front.moved.last_active))
        forwarder = cast(Forwarder, direct.forwarder({"dataplane": reply}, owners))

        def end() -> None:
            forwarder.close()
            front.close()
            self.lease.release(token)
        try:
            self.worker.ready()
        except RpcUnavailable as e:
            end()
            raise WireError(Code.BUSY, str(e), retry_after=10.0) from None
        return forwarder, end

    def seed(self, session: "LinkSession", request: dict[str, Any]) -> dict[str, Any]:
        """shard/seed: start (or report) seeding the tensor cache with a model's blocks from this tower's store."""
        r = validate(request, {"blob": Field(bytes, required=True, check=max_len(32)),
                               "blocks": Field(list, required=True, check=max_len(2)), "poll": Field(bool)})
        blocks = r["blocks"]
        if len(r["blob"]) != 32 or len(blocks) != 2 or not all(isinstance(b, int) and 0 <= b < 1 << 16 for b in blocks) \
                or blocks[0] >= blocks[1]:
            raise WireError(Code.BAD_REQUEST, "shard/seed needs a 32-byte blob id and blocks [first, end)")
        if self.cache is None:
            return {"state": "absent", "tensors": 0, "bytes": 0, "message": "this tower keeps no tensor cache"}
        store = self.tower.store
        if not store.has(r["blob"]):
            store.reload()  # a model added since (rngrid add, a finished pull) is in the index on disk
        if not store.has(r["blob"]):
            return {"state": "absent", "tensors": 0, "bytes": 0}
        key = (r["blob"], (blocks[0], blocks[1]))
        with self._seed_lock:  # not self._lock: a build holds that while it waits on other towers
            state = self.seeding.get(key)
            # A plan's first ask seeds (again: every file it may be served is checked); its polls only report.
            if state is None or state["state"] != "seeding" and not r["poll"]:
                if any(s["state"] == "seeding" for s in self.seeding.values()):
                    return {"state": "busy", "tensors": 0, "bytes": 0}  # one seeding at a time; it loads meanwhile
                self.seeding = {}
                state = self.seeding[key] = {"state": "seeding", "tensors": 0, "bytes": 0}
                threading.Thread(target=self._seed, args=(key, state), name="rngrid-seed", daemon=True).start()
            return dict(state)

    def _seed(self, key: tuple[bytes, tuple[int, int]], state: dict[str, Any]) -> None:
        blob, blocks = key
        cache, store = cast(TensorCache, self.cache), self.tower.store
        try:
            path = store.data_path(blob)
            if path is None:
                raise FileNotFoundError(f"blob {blob.hex()[:16]} left the store")
            tensors = block_tensors(path, blocks)
            cached, written = cache.seed(tensors, lambda offset, size: store.read_verified(blob, offset, size),
                                         blob=blob.hex())
            state.update(state="ready", tensors=cached, bytes=written)
            log.info("tensor cache: blocks %d-%d of %s: %d tensor(s) cached, %d bytes written", blocks[0],
                     blocks[1] - 1, blob.hex()[:16], cached, written)
        except Exception as e:  # a failed seed costs bytes on the link, never the plan
            state.update(state="failed", message=str(e))
            log.warning("tensor cache: seeding %s failed: %s", blob.hex()[:16], e)


def _last_active(session: "LinkSession") -> float | None:
    """When a worker's session last carried an RPC byte (time.monotonic()), over its tunnels or data-plane fronts."""
    times = [f.moved.last_active for f in session.fronts] + [session.tunnels.last_active if session.tunnels else None]
    return max((t for t in times if t is not None), default=None)
