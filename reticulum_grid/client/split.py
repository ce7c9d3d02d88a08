"""Split routing: when no single tower has room for a model, run it over
several (reticulum_grid.split), and fail over to a new plan.

``needs_split`` says whether the ranked towers all lack room (the model's
need from caps/full against each tower's lent memory, or its free memory when
it announces none); ``make_plan`` plans over the live towers lending memory
(split/plan.py); ``SplitStream`` streams from the plan's coordinator and, when
a tower of the plan dies mid-stream, plans again without the towers that no
longer answer and continues from the tokens generated so far
(``continue_tokens``), so the text at temperature 0 is the same.
"""

import dataclasses
import logging
import time

from announce.caps import CapsError, decode_full
from links.wire import Code, WireError
from reticulum_grid.client import router
from reticulum_grid.client.stream import InferenceStream, Usage, continued
from reticulum_grid.split.plan import Offer, PlanError, plan
from reticulum_grid.store import gguf_info

log = logging.getLogger("rngrid.client.split")

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
#: Errors after which a new plan is tried.
REPLAN_ON = {Code.UNREACHABLE, Code.TIMEOUT, Code.NO_TOWER, Code.INTERNAL, Code.RUNNER_LOST}


def capacity_mib(caps):
    """Memory a tower offers a whole model (MiB): what it lends, else its free memory."""
    return caps.lend_mib if caps.lend_mib is not None else caps.hardware.memory_free_mib


def needs_split(grid, model, ranked):
    """True when no ranked tower has ``model`` loaded or room for it (its need
    from caps/full, asked again when the ranking could not learn it)."""
    if not ranked:
        return False
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


def _ask(grid, entries, model, timeout=PROBE_TIMEOUT_S):
    """Ask ``entries`` for caps/full at once. Returns (the entries that
    answered, refreshed; {model: (need MiB, layers)} as they report it; the
    entries still reading the model's GGUF for those facts). Towers that
    answer are healthy again, the others are backed off."""
    answered, facts, reading = [], {}, []
    for entry, full, rtt in grid.caps_full(entries, timeout=timeout, timed=True):
        key = entry.destination_hash
        grid.health.succeeded(key)
        grid.health.rtt(key, rtt)
        try:
            entry = grid.table.refresh_caps(key, decode_full(full["caps"])) or entry
        except (CapsError, KeyError) as e:
            log.warning("bad caps/full from %s: %s", entry.name, e)
            continue
        answered.append(entry)
        for blob in full.get("blobs", ()):
            if blob.get("alias") != model:
                continue
            if blob.get("reading") is True:
                reading.append(entry)
            if isinstance(blob.get("need_mib"), int):
                grid.needs[model] = blob["need_mib"]
                if isinstance(blob.get("n_layers"), int):
                    facts[model] = (blob["need_mib"], blob["n_layers"])
    for entry in entries:
        if entry.destination_hash not in {e.destination_hash for e in answered}:
            grid.health.failed(entry.destination_hash)
    return answered, facts, reading


def _await_facts(grid, entries, model):
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


def _local_facts(grid, model):
    local = grid.local_blob(model)
    if local is None:
        return None
    path = grid.store.info(local).path
    return gguf_info.need_mib(path, 4096, path.stat().st_size), gguf_info.architecture(path)[1]


def make_plan(grid, model, exclude=()):
    """(Plan, {destination hash: table entry}) over the live towers lending
    memory that answer now, skipping ``exclude`` and towers that failed lately
    (backed off). Raises WireError(no_tower)."""
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
    offers = [Offer(e.name, e.destination_hash, e.caps.lend_mib, grid.health.get(e.destination_hash).rtt_s,
                    e.hops, e.caps.load.jobs > 0, e.caps.tokens_per_s, e.caps.model(model) is not None)
              for e in live]
    try:
        return plan(offers, *fact), {e.destination_hash: e for e in live}
    except PlanError as e:
        raise WireError(Code.NO_TOWER, f"{model!r} does not fit the grid: {e}") from None


def wire_plan(placement, experts=False):
    """The ``split`` field of an ai/inference request for ``placement``;
    ``experts``: MoE expert tensors on the workers, the rest on the coordinator."""
    return {"parts": [{"key": p.offer.key, "first": p.first, "end": p.end} for p in placement.parts],
            "experts": experts}


class _PlanStream(InferenceStream):
    """One plan's stream from its coordinator. When it fails, SplitStream
    plans again; asking the same coordinator again with the same plan would
    only wait on the tower that is gone."""

    def _worth_looking_again(self):
        return False


class SplitStream:
    """Iterator of text pieces (str) then one Usage, like InferenceStream,
    for a model split over towers. ``text``, ``usage`` and ``plan`` (the
    Plan in use) are readable at any time."""

    def __init__(self, grid, payload, placement, entries, progress=None, started=None):
        self.grid, self.payload, self.plan, self.entries = grid, payload, placement, entries
        self.progress, self.started = progress, started
        self.text, self.usage, self.ids, self.generated = "", None, [], 0
        self._current = None

    def __iter__(self):
        failovers, errors = 0, []
        for _ in range(MAX_PLANS):
            stream = self._current = self._start()
            pieces = iter(stream)
            try:
                for piece in pieces:
                    if isinstance(piece, Usage):
                        self.usage = self._usage(piece, failovers)
                        yield self.usage
                        return
                    self.text += piece
                    yield piece
            except WireError as e:
                self.ids += stream.ids
                self.generated += stream.generated
                if e.code not in REPLAN_ON:
                    raise
                errors.append(e.message)
                if self.generated and self.payload.get("stop"):
                    raise WireError(e.code, f"a tower of the split went away after {self.generated} tokens; "
                                            "a request with stop strings cannot be continued elsewhere") from None
                failovers += 1
                self._replan()
            finally:
                pieces.close()
        raise WireError(Code.UNREACHABLE, f"the split model failed {MAX_PLANS} times: {'; '.join(errors)}")

    def _start(self):
        # "placement": "experts" (a client-side option) puts MoE experts on the workers.
        payload = continued({k: v for k, v in self.payload.items() if k != "placement"}, self.ids, self.generated)
        payload["split"] = wire_plan(self.plan, experts=self.payload.get("placement") == "experts")
        coordinator = self.entries[self.plan.coordinator.offer.key]
        return _PlanStream(self.grid, payload, [router.Choice(coordinator, ())], progress=self.progress,
                           started=self.started)

    def _replan(self):
        """A new plan without the towers of the failed one that no longer answer."""
        model = self.payload["model"]
        towers = [self.entries[p.offer.key] for p in self.plan.parts]
        answered, _, _ = _ask(self.grid, towers, model)
        gone = {e.destination_hash for e in towers} - {e.destination_hash for e in answered}
        log.info("split failed; planning again without %s",
                 ", ".join(e.name for e in towers if e.destination_hash in gone) or "nobody")
        self.plan, self.entries = make_plan(self.grid, model, exclude=gone)

    def _usage(self, usage, failovers):
        names = " + ".join(self.plan.towers[-1:] + self.plan.towers[:-1])
        return dataclasses.replace(usage, tower=names, failovers=usage.failovers + failovers,
                                   prompt_tokens=usage.prompt_tokens - len(self.ids),
                                   completion_tokens=usage.completion_tokens + self.generated)

    @property
    def tower(self):
        return self._current.tower if self._current else None

    def cancel(self):
        if self._current is not None:
            self._current.cancel()
