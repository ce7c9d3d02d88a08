"""The figures a client plans a split with: each tower's bandwidth, the coordinator's round
trips to its workers, and estimates for a plan and for the best single tower (split/estimate.py).

- Bandwidth: the decode rate this client measured of a tower's streams (or,
  clamped, what it announces; HealthBook.believed_decode_tokens_per_s) times the bytes a token reads
  of the largest model it serves; for a tower that serves none (a lender:
  its split streams say nothing of its own compute), the median of the towers
  of its hardware kind (backend and device) that do; else its backend's prior.
- Round trips: the would-be coordinator's own (``split/probe``: it pings the
  others over its Links), waited for up to PROBE_WAIT_S; a tower it cannot
  reach is left out of the plan. Where it loaded a split model with a worker
  before, also the round trip of an RPC command the way that load's bytes
  went (``rpc_rtts``), which an experts plan costs its crossings with.
- A single tower "could hold it" when the model fits its free VRAM, or its
  VRAM and RAM together (llama.cpp keeps the rest in RAM, read at the CPU's
  bandwidth), or, on a CPU tower, the memory it offers (what it lends).
"""

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from announce.table import TowerEntry

from links.wire import WireError
from reticulum_grid.client import router
from reticulum_grid.client.measured import kind_of
from reticulum_grid.client.parts import GridParts
from reticulum_grid.split import estimate


#: Seconds a plan waits for its coordinator's round trips.
PROBE_WAIT_S = 10.0
PROBE_POLL_S = 0.3
MIB = 1 << 20


def bandwidth(grid: GridParts, entry: TowerEntry, served_bytes: Mapping[bytes, int]) -> float:
    """Bytes/s ``entry``'s tower reads weights at (see the module doc)."""
    backend = entry.caps.hardware.backend
    own = _measured(grid, entry, served_bytes)
    if own:
        return estimate.bandwidth(backend, own)
    kind = kind_of(backend, entry.caps.hardware.device)
    peers = [rate for e in grid.table.live() if kind_of(e.caps.hardware.backend, e.caps.hardware.device) == kind
             if (rate := _measured(grid, e, served_bytes))]
    return estimate.bandwidth(backend, statistics.median_low(peers) if peers else 0.0)


def _measured(grid: GridParts, entry: TowerEntry, served_bytes: Mapping[bytes, int]) -> float:
    """Bytes/s of weights ``entry``'s tower read serving a whole model (0.0: it serves none, or unmeasured)."""
    return grid.health.believed_decode_tokens_per_s(entry.destination_hash, entry.caps) * served_bytes.get(
        entry.destination_hash, 0)


class CoordinatorView(NamedTuple):
    """What a coordinator measures of its links to others, by destination hash
    (split/probe.py): ``rtts`` (s, its RNS pings), ``rates`` (link bytes/s seen
    while it loaded a split model there) and ``rpc_rtts`` (s, an RPC command's
    round trip the way that load's bytes went)."""
    rtts: dict[bytes, float]
    rates: dict[bytes, float]
    rpc_rtts: dict[bytes, float]


def coordinator_view(grid: GridParts, coordinator: TowerEntry, others: Sequence[TowerEntry]) -> CoordinatorView:
    """The CoordinatorView from ``coordinator`` to ``others``, as it measures
    them (split/probe); all empty when it cannot say (an older tower, or it does
    not answer)."""
    keys = [e.destination_hash for e in others]
    if not keys:
        return CoordinatorView({}, {}, {})
    conn, deadline = grid.connection(coordinator), time.monotonic() + PROBE_WAIT_S
    while True:
        try:
            reply = conn.request("split/probe", {"towers": keys}, PROBE_WAIT_S)
        except WireError:
            return CoordinatorView({}, {}, {})
        rtts = _floats(reply.get("rtts"))
        if not reply.get("pending") or time.monotonic() > deadline:
            return CoordinatorView(rtts, _floats(reply.get("rates")), _floats(reply.get("rpc_rtts")))
        time.sleep(PROBE_POLL_S)


def _floats(value: object) -> dict[bytes, float]:
    """{bytes: float} from a reply's {hex: number} map, trusting nothing."""
    out: dict[bytes, float] = {}
    for key, number in (value.items() if isinstance(value, dict) else ()):
        try:
            raw = bytes.fromhex(key)
        except (TypeError, ValueError):
            continue
        if len(raw) == 16 and isinstance(number, (int, float)) and not isinstance(number, bool) and number >= 0:
            out[raw] = float(number)
    return out


def read_bytes(grid: GridParts, model: str, need_mib: int) -> int:
    """Bytes a token of ``model`` reads, as its towers' caps/full say; its file's
    size where they do not say (an older tower), else its need (``need_mib``)."""
    known = grid.model_facts.get(model, {})
    return known.get("read_bytes") or known.get("bytes") or need_mib * MIB


def best_single(grid: GridParts, entries: Sequence[TowerEntry], model_read_bytes: int, need_mib: int,
                served_bytes: Mapping[bytes, int]) -> estimate.Estimate | None:
    """The Estimate of the fastest tower of ``entries`` that could hold the
    model (of which a token reads ``model_read_bytes``) whole (see the module doc), or None."""
    best = None
    for entry in entries:
        hw = entry.caps.hardware
        # A GPU tower may keep the layers beyond its VRAM in RAM; a CPU tower offers what it lends.
        offered = entry.caps.lend_mib if entry.caps.lend_mib is not None else hw.memory_free_mib
        if need_mib > (max(offered, router.room_mib(hw)) if hw.vram_total_mib else offered):
            continue
        bw = bandwidth(grid, entry, served_bytes)
        if hw.vram_total_mib and need_mib > hw.memory_free_mib:  # the rest is read from RAM at the CPU's pace
            in_vram = hw.memory_free_mib / need_mib
            bw = 1.0 / (in_vram / bw + (1 - in_vram) / estimate.PRIOR_BANDWIDTH["cpu"])
        found = estimate.whole(model_read_bytes, bw, entry.name)
        if best is None or found.tokens_per_s > best.tokens_per_s:
            best = found
    return best
