"""Routing v1: which tower runs a request for a model.

Candidates are live towers whose caps list the model (by alias or blob id
prefix). They are ranked by, in order:

1. the model is loaded (not only on disk),
2. most free memory (MiB): VRAM, or RAM on a CPU-only tower,
3. fewest hops.

``--tower`` overrides routing entirely (see Grid.route).
"""

from links.wire import Code, WireError


def candidates(entries, model):
    return [e for e in entries if e.caps.model(model) is not None]


def score(entry, model):
    """Sort key, lower is better."""
    cap = entry.caps.model(model)
    return (not cap.loaded, -entry.caps.hardware.memory_free_mib, entry.hops)


def rank(entries, model):
    return sorted(candidates(entries, model), key=lambda e: score(e, model))


def choose(entries, model):
    """The best tower for ``model``. Raises WireError(no_tower)."""
    ranked = rank(entries, model)
    if not ranked:
        raise WireError(Code.NO_TOWER, f"no tower has model {model!r}")
    return ranked[0]
