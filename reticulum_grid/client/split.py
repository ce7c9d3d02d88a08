"""Split routing: when no single tower has room for a model, run it over
several (reticulum_grid.split), and fail over to a new plan.

``needs_split`` says whether the ranked towers all lack room (the model's
need from caps/full against each tower's lent memory, or its free memory when
it announces none); ``make_plan`` plans over the live towers lending memory
(split/plan.py), each believed to lend what it announces until a plan failed
to load on it for want of memory (router.HealthBook.believed_lend_mib: the
client marks it, and plans again); ``SplitStream`` streams from the plan's
coordinator and, when a tower of the plan dies mid-stream, plans again
without the towers that no longer answer and continues from the tokens
generated so far (``continue_tokens``), so the text at temperature 0 is the same.
"""

import dataclasses
import logging
import time
from collections.abc import Collection, Generator, Sequence
from pathlib import Path
from typing import Any, cast

from announce.caps import Caps
from announce.table import TowerEntry
from links.wire import LINK_LOST, Code, WireError
from reticulum_grid.client import estimates, router, strategies
from reticulum_grid.client.parts import GridParts
from reticulum_grid.client.pieces import Text, ToolCallDelta, Usage
from reticulum_grid.client.stream import InferenceStream, continued
from reticulum_grid.split import estimate, tensor
from reticulum_grid.split.experts import plan_experts
from reticulum_grid.split.plan import STRATEGIES, Offer, Plan, PlanError, plan
from reticulum_grid.split.supervisor import named_worker
from reticulum_grid.store import gguf_info
from reticulum_grid.store.sync import Progress


#: A model's memory need (MiB) and layer count, as towers (or its GGUF here) say.
Facts = dict[str, tuple[int, int]]

log = logging.getLogger("rngrid.client.split")
MIB = 1 << 20

#: Plans one request tries at most (the first and its failovers).
MAX_PLANS = 3
#: Seconds a tower of a failed plan gets to answer caps/full before it counts as gone.
PROBE_TIMEOUT_S = 8.0
#: Seconds a tower gets to answer caps/full for a new plan (a tower reads a
#: model's GGUF metadata the first time it is asked: seconds on a busy machine).
PLAN_TIMEOUT_S = 20.0
#: How long a client waits for a tower still reading a model's memory need and
#: layer count (from the GGUF, in the background: seconds per file), asking
#: again every FACTS_POLL_S seconds.
FACTS_WAIT_S = 30.0
FACTS_POLL_S = 0.5
#: How a request may be split (its ``split_policy``; "auto": only when no one tower can hold
#: it, and not when the estimate is below MIN_SPLIT_TOKENS_S or a tower holding it partly in RAM is faster).
POLICIES = ("auto", "always", "never")
#: How a split request may be placed (its ``placement``): a strategy by name (which splits it whatever
#: the policy says), or "auto": the planner's choice.
PLACEMENTS = ("auto",) + STRATEGIES
#: Estimated tokens/s below which "auto" refuses a split (too_slow) rather than run it.
MIN_SPLIT_TOKENS_S = 1.0
#: What a request that found every fitting worker held by other plans suggests waiting (seconds;
#: split/lease.py's own hint).
BUSY_RETRY_S = 10.0
#: Errors after which a new plan is tried (insufficient_memory: the tower that
#: could not hold its part is believed to lend less, see _mark_claim; busy naming
#: a worker: planned without it).
REPLAN_ON = LINK_LOST | {Code.NO_TOWER, Code.INTERNAL, Code.RUNNER_LOST, Code.INSUFFICIENT_MEMORY}


def capacity_mib(caps: Caps) -> int:
    """Memory a tower offers a whole model (MiB): what it lends, else its free memory."""
    return caps.lend_mib if caps.lend_mib is not None else caps.hardware.memory_free_mib


def needs_split(grid: GridParts, model: str, ranked: Sequence[router.Choice], policy: str = "auto") -> bool:
    """True when ``model`` should run split: ``policy`` "always" (when towers
    were ranked), never for "never", and for "auto" when no ranked tower has it
    loaded or room for it (its need from caps/full, asked again when the
    ranking could not learn it)."""
    if policy not in POLICIES:
        raise WireError(Code.BAD_REQUEST, f"split_policy must be one of {', '.join(POLICIES)}")
    if not ranked or policy == "never":
        return False
    if policy == "always":
        return True
    need = grid.needs.get(model)
    if not need:
        _, _, reading = _ask(grid, [c.entry for c in ranked], model, PLAN_TIMEOUT_S)
        if reading:
            _await_facts(grid, reading, model)
        need = grid.needs.get(model)
    if not need:
        return False
    for choice in ranked:
        cap = choice.entry.caps.model(model)
        if (cap is not None and cap.loaded) or need <= capacity_mib(choice.entry.caps):
            return False
    return True


def _ask(grid: GridParts, entries: Sequence[TowerEntry], model: str,
         timeout: float = PROBE_TIMEOUT_S) -> tuple[list[TowerEntry], Facts, list[TowerEntry]]:
    """Ask ``entries`` for caps/full at once. Returns (the entries that
    answered, refreshed; {model: (need MiB, layers)} as they report it; the
    entries still reading the model's GGUF for those facts). Towers that
    answer are healthy again, the others are backed off."""
    answered: list[TowerEntry] = []
    facts: Facts = {}
    reading: list[TowerEntry] = []
    for entry, full, rtt in grid.caps_full_timed(entries, timeout=timeout):
        grid.health.succeeded(entry.destination_hash)
        grid.health.rtt(entry.destination_hash, rtt)
        answered.append(entry)
        blob = full.blob(model)
        if blob is not None and blob.reading:
            reading.append(entry)
        if blob is not None and blob.need_mib is not None and blob.n_layers is not None:
            facts[model] = (blob.need_mib, blob.n_layers)
    for entry in entries:
        if entry.destination_hash not in {e.destination_hash for e in answered}:
            grid.health.failed(entry.destination_hash)
    return answered, facts, reading


def _await_facts(grid: GridParts, entries: list[TowerEntry], model: str) -> Facts:
    """{model: (need MiB, layers)} once ``entries`` (towers reading the model's
    GGUF in the background: seconds after they start or receive it) know them;
    {} when none does within FACTS_WAIT_S or none is reading any more."""
    deadline = time.monotonic() + FACTS_WAIT_S
    while entries and time.monotonic() < deadline:
        time.sleep(FACTS_POLL_S)
        _, facts, entries = _ask(grid, entries, model, PLAN_TIMEOUT_S)
        if facts.get(model):
            return facts
    return {}


def _local_facts(grid: GridParts, model: str) -> tuple[int, int] | None:
    local = grid.local_blob(model)
    if local is None:
        return None
    # local_blob resolved a complete blob, which has a path.
    path: Path = grid.store.info(local).path  # type: ignore[union-attr, assignment]
    return gguf_info.need_mib(path, 4096, path.stat().st_size), gguf_info.architecture(path)[1]


def make_plan(grid: GridParts, model: str, exclude: Collection[bytes] = (), strategy: str = "pipeline",
              shape: tuple[int, int] = strategies.DEFAULT_SHAPE) -> tuple[Plan, dict[bytes, TowerEntry]]:
    """(Plan, {destination hash: table entry}) of ``strategy`` (plan.STRATEGIES,
    or "auto": the fastest for a request of ``shape``, (prompt tokens,
    max_tokens), client/strategies.py) over the live towers lending memory
    that answer now, skipping ``exclude`` and towers that failed lately
    (backed off). Every tower that answers the discovery ping counts, not
    only the first heard (grid.discover: until the table goes quiet). Raises WireError(no_tower)."""
    grid.discover(lambda entries: False, PLAN_TIMEOUT_S)
    lenders = [e for e in grid.table.live() if e.caps.lend_mib and e.destination_hash not in exclude
               and not grid.health.get(e.destination_hash).backed_off()]
    live, facts, reading = _ask(grid, lenders, model, PLAN_TIMEOUT_S)
    live = [e for e in live if e.caps.lend_mib]
    holders = [e for e in live if e.caps.model(model) is not None]
    fact = facts.get(model) or _local_facts(grid, model)
    if not (holders or grid.local_blob(model) is not None):
        heard = ", ".join(e.name for e in live) or "none"
        raise WireError(Code.NO_TOWER, f"no tower lending memory holds {model!r} (lenders answering: {heard})")
    if fact is None:
        fact = _await_facts(grid, reading, model).get(model)
    if fact is None:
        raise WireError(Code.NO_TOWER, f"no tower could say how many layers {model!r} has "
                                       f"within {FACTS_WAIT_S:.0f} s")
    known = grid.model_facts.get(model, {})
    try:
        first = _place("pipeline" if strategy == "auto" else strategy, _offers(grid, live, model), fact, known)
        coordinator = next(e for e in live if e.destination_hash == first.coordinator.offer.key)
        rtts, rates, rpc_rtts = estimates.coordinator_view(grid, coordinator, [e for e in live if e is not coordinator])
        # the coordinator's own view: it pays these round trips on every token
        reached = [e for e in live if e is coordinator or e.destination_hash in rtts] if rtts else live
        view = _offers(grid, reached, model, rtts, coordinator) if rtts else _offers(grid, live, model)
        costs = strategies.costs(grid, live, model, fact, rtts or {
            e.destination_hash: grid.health.get(e.destination_hash).rtt_s for e in live}, rates, rpc_rtts)
        if strategy == "auto":
            return strategies.auto(lambda name, offers: _place(name, offers, fact, known), view, costs,
                                   shape), {e.destination_hash: e for e in live}
        placement = _place(strategy, view, fact, known) if rtts else first
    except PlanError as e:
        raise WireError(Code.NO_TOWER, f"{model!r} does not fit the grid{_as(strategy)}: {e}") from None
    if strategy != "pipeline":
        return strategies.estimated(placement, costs, shape)[0], {e.destination_hash: e for e in live}
    bandwidths = {e.destination_hash: estimates.bandwidth(grid, e, grid.served) for e in live}
    cost = estimate.split(placement, estimates.read_bytes(grid, model, fact[0]), bandwidths,
                          rtts or {p.offer.key: p.offer.rtt_s for p in placement.parts},
                          known.get("embedding", 4096), rates)
    return dataclasses.replace(placement, estimate=cost), {e.destination_hash: e for e in live}


def _place(strategy: str, offers: list[Offer], fact: tuple[int, int], known: dict[str, int]) -> Plan:
    """The Plan of ``strategy`` for a model of ``fact`` (need MiB, layers) and
    ``known`` facts (its expert tensors' bytes). Raises PlanError."""
    if strategy == "experts":
        return plan_experts(offers, *fact, -(-known.get("expert_bytes", 0) // MIB))
    if strategy == "tensor":
        return tensor.plan_tensor(offers, *fact)
    return plan(offers, *fact)


def _as(strategy: str) -> str:
    return "" if strategy == "pipeline" else f" with {strategy} placement"


def _offers(grid: GridParts, entries: Sequence[TowerEntry], model: str, rtts: dict[bytes, float] | None = None,
            coordinator: TowerEntry | None = None) -> list[Offer]:
    """The plan's Offers; ``rtts`` (the coordinator's view) replace the client's round trips."""
    def rtt(entry: TowerEntry) -> float:
        if rtts is None:
            return grid.health.get(entry.destination_hash).rtt_s
        return 0.0 if entry is coordinator else rtts[entry.destination_hash]
    # Lenders only (make_plan keeps those): lend_mib is set.
    return [Offer(e.name, e.destination_hash, cast(int, grid.health.believed_lend_mib(e.destination_hash, e.caps)),
                  rtt(e), e.hops, e.caps.load.jobs > 0, grid.health.believed_tokens_per_s(e.destination_hash, e.caps),
                  e.caps.model(model) is not None) for e in entries]


def single_or_split(grid: GridParts, model: str, ranked: Sequence[router.Choice], policy: str,
                    strategy: str = "auto", shape: tuple[int, int] = strategies.DEFAULT_SHAPE,
                    ) -> tuple[Plan, dict[bytes, TowerEntry]] | None:
    """None to run ``model`` whole on the ranked towers, else (Plan, entries) to
    run it split (see POLICIES, PLACEMENTS and choose); a ``strategy`` by name
    splits it as "always" would, "auto" picks the fastest for a request of
    ``shape`` (prompt tokens, max_tokens). Raises WireError (too_slow, no_tower,
    bad_request for an unknown policy or strategy)."""
    if strategy not in PLACEMENTS:
        raise WireError(Code.BAD_REQUEST, f"placement must be one of {', '.join(PLACEMENTS)}")
    if strategy != "auto" and policy != "never":
        policy = "always"
    if not needs_split(grid, model, ranked, policy):
        return None
    placement, entries = make_plan(grid, model, strategy=strategy, shape=shape)
    if policy == "always":
        return placement, entries
    need = grid.needs.get(model, 0)
    single = estimates.best_single(grid, [c.entry for c in ranked], estimates.read_bytes(grid, model, need), need,
                                   grid.served)
    # make_plan's Plan carries its estimate.
    return (placement, entries) if choose(model, cast(estimate.Estimate, placement.estimate), single) else None


def choose(model: str, split_estimate: estimate.Estimate, single_estimate: estimate.Estimate | None) -> bool:
    """True to run ``model`` split under "auto", False to run it whole on the
    tower of ``single_estimate`` (an Estimate or None: no tower could hold
    it) because that is at least as fast. Raises WireError(too_slow) when the
    split's estimate is below MIN_SPLIT_TOKENS_S (and no single tower is faster)."""
    if single_estimate is not None and single_estimate.tokens_per_s >= split_estimate.tokens_per_s:
        log.info("%s: whole on %s (~%.1f tokens/s, partly in RAM) beats the split (~%.1f tokens/s)", model,
                 single_estimate.where, single_estimate.tokens_per_s, split_estimate.tokens_per_s)
        return False
    if split_estimate.tokens_per_s < MIN_SPLIT_TOKENS_S:
        raise WireError(Code.TOO_SLOW, f"split over {split_estimate.where}, {model!r} would run at "
                                       f"~{split_estimate.tokens_per_s:.2f} tokens/s (estimate); "
                                       "ask with split_policy always (rngrid infer --split always) to run it anyway")
    return True


def wire_plan(placement: Plan) -> dict[str, Any]:
    """The ``split`` field of an ai/inference request for ``placement`` (its
    strategy; ``experts`` too, as coordinators before strategies read it)."""
    return {"parts": [{"key": p.offer.key, "first": p.first, "end": p.end} for p in placement.parts],
            "experts": placement.strategy == "experts", "strategy": placement.strategy}


class _PlanStream(InferenceStream):
    """One plan's stream from its coordinator. When it fails, SplitStream
    plans again; asking the same coordinator again with the same plan would
    only wait on the tower that is gone."""

    def _worth_looking_again(self) -> bool:
        return False

    # A worker of the plan that serves another coordinator's plan (busy, naming
    # it) is no busy coordinator to wait for: SplitStream plans without it.
    def _note_refusal(self, entry: TowerEntry, error: WireError) -> None:
        _raise_if_a_worker_is_held(error)
        super()._note_refusal(entry, error)

    def _failed(self, entry: TowerEntry, error: WireError) -> None:
        _raise_if_a_worker_is_held(error)
        super()._failed(entry, error)


def _raise_if_a_worker_is_held(error: WireError) -> None:
    if error.code == Code.BUSY and named_worker(error.message):
        raise error


class SplitStream:
    """Iterator of text pieces (str) then one Usage, like InferenceStream,
    for a model split over towers. ``text``, ``usage`` and ``plan`` (the
    Plan in use) are readable at any time."""

    def __init__(self, grid: GridParts, payload: dict[str, Any], placement: Plan, entries: dict[bytes, TowerEntry],
                 progress: Progress | None = None, started: float | None = None) -> None:
        self.grid, self.payload, self.plan, self.entries = grid, payload, placement, entries
        self.progress, self.started = progress, started
        self.text, self.generated = "", 0
        self.usage: Usage | None = None
        self.ids: list[int] = []
        #: workers that answered busy: their RPC server serves another plan
        self.busy: set[bytes] = set()
        self._current: _PlanStream | None = None

    def __iter__(self) -> Generator[Text | ToolCallDelta | Usage, None, None]:
        failovers = 0
        errors: list[str] = []
        for _ in range(MAX_PLANS):
            stream = self._current = self._start()
            pieces = iter(stream)
            try:
                for piece in pieces:
                    if isinstance(piece, Usage):
                        self._claims_held()
                        self.usage = self._usage(piece, failovers)
                        yield self.usage
                        return
                    if isinstance(piece, Text):  # a tool call's pieces are no text
                        self.text += piece
                    yield piece
            except WireError as e:
                self.ids += stream.ids
                self.generated += stream.generated
                held = named_worker(e.message) if e.code == Code.BUSY else None
                if self._refused_tensor(e):  # the planner's pick, for an architecture llama.cpp splits otherwise
                    self.plan, self.entries = make_plan(self.grid, self.payload["model"], strategy="pipeline")
                    continue
                if e.code not in REPLAN_ON and held is None:
                    raise
                if held is not None:  # its RPC server serves another coordinator's plan (split/lease.py)
                    self.busy.add(held)
                if e.code == Code.INSUFFICIENT_MEMORY and not stream.generated:
                    self._mark_claim(e)
                errors.append(e.message)
                if self.generated and self.payload.get("stop"):
                    raise WireError(e.code, f"a tower of the split went away after {self.generated} tokens; "
                                            "a request with stop strings cannot be continued elsewhere") from None
                failovers += 1
                self._replan()
            finally:
                pieces.close()
        raise WireError(Code.UNREACHABLE, f"the split model failed {MAX_PLANS} times: {'; '.join(errors)}")

    def _start(self) -> _PlanStream:
        payload = continued(self.payload, self.ids, self.generated)
        payload["split"] = wire_plan(self.plan)
        coordinator = self.entries[self.plan.coordinator.offer.key]
        return _PlanStream(self.grid, payload, [router.Choice(coordinator, ())], progress=self.progress,
                           started=self.started)

    def _refused_tensor(self, error: WireError) -> bool:
        """True when a tensor plan the planner picked (placement auto) was refused before any token."""
        return error.code == Code.UNSUPPORTED and self.plan.strategy == "tensor" and not self.generated \
            and self.payload.get("placement", "auto") == "auto"

    def _mark_claim(self, error: WireError) -> None:
        """The plan did not load for want of memory on the worker the
        coordinator names (or on the coordinator): that tower is believed to
        lend less from now on (router.HealthBook.believed_lend_mib)."""
        coordinator = self.plan.coordinator.offer.key
        short = named_worker(error.message) or coordinator
        part = next((p for p in self.plan.parts if p.offer.key == short), None)
        if part is None:
            return
        log.info("%s could not hold its %d MiB of the split (it claims to lend %d MiB)", part.offer.name, part.mib,
                 part.offer.lend_mib)
        self.grid.health.rates.lend_failed(short, part.mib)
        if short != coordinator:  # the coordinator only passed the worker's failure on
            self.grid.health.succeeded(coordinator)

    def _claims_held(self) -> None:
        """The plan loaded: every part held its share."""
        for part in self.plan.parts:
            self.grid.health.rates.lend_held(part.offer.key, part.mib)

    def _replan(self) -> None:
        """A new plan without the towers of the failed one that no longer answer."""
        model = self.payload["model"]
        towers = [self.entries[p.offer.key] for p in self.plan.parts]
        answered, _, _ = _ask(self.grid, towers, model)
        gone = {e.destination_hash for e in towers} - {e.destination_hash for e in answered}
        log.info("split failed; planning again without %s", ", ".join(
            e.name for e in towers if e.destination_hash in gone | self.busy) or "nobody")
        try:
            self.plan, self.entries = make_plan(self.grid, model, exclude=gone | self.busy,
                                                strategy=self.plan.strategy)
        except WireError as e:
            if e.code != Code.NO_TOWER or not self.busy:
                raise
            held = ", ".join(self.entries[k].name if k in self.entries else k.hex()[:16] for k in sorted(self.busy))
            raise WireError(Code.BUSY, f"{held} serve(s) another coordinator's split plan, and without them: "
                                       f"{e.message}", retry_after=BUSY_RETRY_S) from None

    def _usage(self, usage: Usage, failovers: int) -> Usage:
        names = " + ".join(self.plan.towers[-1:] + self.plan.towers[:-1])
        return dataclasses.replace(usage, tower=names, failovers=usage.failovers + failovers,
                                   prompt_tokens=usage.prompt_tokens - len(self.ids),
                                   completion_tokens=usage.completion_tokens + self.generated)

    @property
    def tower(self) -> str | None:
        return self._current.tower if self._current else None

    def cancel(self) -> None:
        if self._current is not None:
            self._current.cancel()
