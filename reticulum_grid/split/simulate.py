"""A split planned on paper: the real planner (split/plan.py) and estimator
(split/estimate.py) run on offers and a model described in a file, with no
network and no towers (``rngrid route --simulate FILE``).

The file is TOML (JSON when its name ends in .json), keys as in docs/split.md:

    model = "llama-70b-q4_k_m"   # a built-in shape (split/shapes.py) or a GGUF path, relative to the file
    context = 4096               # tokens of KV cache the model is planned with (default 4096, as make_plan)

    [[offers]]                   # one per tower
    name = "rtx5090"
    backend = "cuda"             # sets its memory bandwidth prior (estimate.PRIOR_BANDWIDTH) ...
    bandwidth_gb_s = 900         # ... unless given: GB/s it reads weights at (optional)
    lend_mib = 28700             # memory it lends
    rtt_ms = 0.5                 # round trip between it and the coordinator
    rate_mbit_s = 1000           # its link's rate to the coordinator (optional: estimate.PRIOR_LINK_RATE)
    hops = 1                     # optional, as Offer: hops, training, has_model

The planner picks the coordinator with every offer's round trip, then plans
again with the coordinator's own view (its round trip to itself is 0), as
client/split.py's make_plan does with the coordinator's measured round trips.
"""

import dataclasses
import json
import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reticulum_grid.split import estimate, shapes
from reticulum_grid.split.plan import Offer, Plan, plan

#: The KV cache a simulated model is planned with (tokens): what make_plan counts a local GGUF at.
CONTEXT = 4096
#: Offers a file may name.
MAX_OFFERS = 64


class SimulationError(ValueError):
    """The file cannot be read or says something the planner cannot take; the message says what."""


@dataclass(frozen=True)
class Scenario:
    """What a file describes. ``bandwidths``: {offer key: bytes/s it reads
    weights at}; ``rates``: {offer key: link bytes/s}, where given."""
    shape: shapes.Shape
    offers: tuple[Offer, ...]
    bandwidths: dict[bytes, float]
    rates: dict[bytes, float]
    context: int = CONTEXT


def load(path: str | Path) -> Scenario:
    """The Scenario in the file at ``path``. Raises SimulationError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as e:  # JSON and TOML errors are ValueErrors
        raise SimulationError(f"{path}: {e}") from None
    if not isinstance(data, dict):
        raise SimulationError(f"{path}: the top level must be a table")
    try:
        return _scenario(data, path.parent)
    except SimulationError as e:
        raise SimulationError(f"{path}: {e}") from None


def _scenario(data: dict[str, Any], folder: Path) -> Scenario:
    _known(data, {"model", "context", "offers"}, "the file")
    shape = _shape(_get(data, "model", str, None, required=True), folder)
    context = _get(data, "context", int, CONTEXT, _positive)
    rows = data.get("offers")
    if not isinstance(rows, list) or not rows or len(rows) > MAX_OFFERS:
        raise SimulationError(f"offers must be a list of 1 to {MAX_OFFERS} tables")
    offers, bandwidths, rates = [], {}, {}
    for row in rows:
        offer, bandwidth, rate = _offer(row, shape.weight_bytes)
        if offer.key in bandwidths:
            raise SimulationError(f"two offers are named {offer.name!r}")
        offers.append(offer)
        bandwidths[offer.key] = bandwidth
        if rate is not None:
            rates[offer.key] = rate
    return Scenario(shape, tuple(offers), bandwidths, rates, context)


def _shape(model: str, folder: Path) -> shapes.Shape:
    if model in shapes.SHAPES:
        return shapes.SHAPES[model]
    path = folder / model
    if not path.is_file():
        raise SimulationError(f"model {model!r} is neither a file nor one of {', '.join(shapes.SHAPES)}")
    try:
        return shapes.from_gguf(path)
    except (OSError, ValueError) as e:
        raise SimulationError(f"model {model!r}: {e}") from None


def _offer(row: object, model_bytes: int) -> tuple[Offer, float, float | None]:
    """(Offer, bytes/s it reads weights at, its link's bytes/s or None) of one offers table."""
    if not isinstance(row, dict):
        raise SimulationError("each offer must be a table")
    name = _get(row, "name", str, None, _showable, "an offer", required=True)
    where = f"offer {name!r}"
    _known(row, {"name", "backend", "bandwidth_gb_s", "lend_mib", "rtt_ms", "rate_mbit_s", "hops", "training",
                 "has_model"}, where)
    backend = _get(row, "backend", str, "cpu", where=where)
    if backend not in estimate.PRIOR_BANDWIDTH:
        raise SimulationError(f"{where}: backend must be one of {', '.join(estimate.PRIOR_BANDWIDTH)}")
    given = _get(row, "bandwidth_gb_s", float, None, _positive, where)
    # The estimator's own clamps apply to a stated bandwidth as to a measured one.
    bandwidth = (estimate.bandwidth(backend, given * 1e9) if given is not None
                 else estimate.bandwidth(backend))
    rate = _get(row, "rate_mbit_s", float, None, _positive, where)
    offer = Offer(name, name.encode("utf-8"), _get(row, "lend_mib", int, None, _not_negative, where, required=True),
                  _get(row, "rtt_ms", float, 0.0, _not_negative, where) / 1000,
                  _get(row, "hops", int, 1, _positive, where), _get(row, "training", bool, False, where=where),
                  bandwidth / model_bytes, _get(row, "has_model", bool, False, where=where))
    return offer, bandwidth, rate * 1e6 / 8 if rate is not None else None


def _known(table: Mapping[str, Any], keys: set[str], where: str) -> None:
    unknown = sorted(set(table) - keys)
    if unknown:
        raise SimulationError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; known: "
                              f"{', '.join(sorted(keys))}")


def _showable(name: str) -> bool:
    return 0 < len(name) <= 64 and name.isprintable()


def _positive(x: float) -> bool:
    return x > 0


def _not_negative(x: float) -> bool:
    return x >= 0


def _get(table: Mapping[str, Any], key: str, kind: type, default: Any, check: Callable[[Any], bool] | None = None,
         where: str = "the file", required: bool = False) -> Any:
    """``table[key]`` of ``kind`` (an int passes for a float), ``default`` when absent and not ``required``."""
    if key not in table:
        if required:
            raise SimulationError(f"{where}: {key} is missing")
        return default
    value: Any = table[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    wrong = not isinstance(value, kind) or (kind is int and isinstance(value, bool))
    if wrong or (isinstance(value, float) and not math.isfinite(value)) or (check is not None and not check(value)):
        raise SimulationError(f"{where}: {key} = {value!r} is not a valid {kind.__name__} here")
    return value


def run(scenario: Scenario) -> Plan:
    """The Plan, with its Estimate, the planner makes for ``scenario``. Raises
    plan.PlanError when the offers cannot hold the model."""
    shape = scenario.shape
    need = shape.need_mib(scenario.context)
    coordinator = plan(scenario.offers, need, shape.blocks).coordinator.offer.key
    own_view = [dataclasses.replace(o, rtt_s=0.0) if o.key == coordinator else o for o in scenario.offers]
    placement = plan(own_view, need, shape.blocks)
    cost = estimate.split(placement, shape.weight_bytes, scenario.bandwidths, {o.key: o.rtt_s for o in own_view},
                          shape.embedding, scenario.rates)
    return dataclasses.replace(placement, estimate=cost)
