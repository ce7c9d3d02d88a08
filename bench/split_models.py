"""What bench/split.py runs on: the models it writes (a mixture of experts, a
draft, the GPU check's random 8B shape) and the memory each tower lends so
that the client plans a split over all of them (the lends are below the
model's need on purpose: one tower alone must not hold it)."""

import math
from pathlib import Path

from reticulum_grid.inference.default_model import default_model_path
from reticulum_grid.store import gguf_info

#: Each worker's share of a model's need when the coordinator lends just under it (see split_lends).
WORKER_SHARE = 0.115
#: MiB the lenders lend of the bundled model (~316 MiB, ~348 with the plan's headroom), per tower count:
#: (coordinator, each worker). No fewer towers hold it; with a draft (whose need counts too) twice that.
BUNDLED_LENDS = {2: (200, 200), 3: (150, 120)}
#: The MoE model --strategy experts writes when given none (testbed/tiny_models.write_tiny), and what each lender
#: lends then (MiB): below its need (~243 MiB) with headroom, above all but its 48 MiB of experts with headroom.
MOE_SHAPE = {"arch": "qwen3moe", "layers": 8, "dim": 128, "ff": 512, "heads": 4, "experts": 8}
MOE_LEND_MIB = 230


def split_lends(model, towers=2, n_ctx=4096):
    """lends_for the need of ``model`` (the towers' own estimate,
    store/gguf_info.need_mib, n_ctx 4096) over ``towers`` towers."""
    return lends_for(gguf_info.need_mib(model, n_ctx, Path(model).stat().st_size), towers)


def lends_for(need_mib, towers=2):
    """(coordinator MiB, then each worker's) that make the planner split a
    model of ``need_mib`` over ``towers`` towers with each worker holding a few
    of its layers: each worker lends WORKER_SHARE of the need and the
    coordinator the need less what the workers beyond the first lend, so that
    every tower is needed (one fewer falls short of the need plus the plan's
    headroom) and all together hold it."""
    worker = math.ceil(need_mib * WORKER_SHARE)
    return (need_mib - (towers - 2) * worker,) + (worker,) * (towers - 1)


def default_lends(draft, towers=2):
    """BUNDLED_LENDS for ``towers`` towers, doubled with a draft: (coordinator MiB, then each worker's)."""
    coord, worker = (mib * (2 if draft else 1) for mib in BUNDLED_LENDS[towers])
    return (coord,) + (worker,) * (towers - 1)


def moe_model(tmp):
    """A Qwen3-MoE-shaped GGUF (MOE_SHAPE) with random weights and the bundled model's tokenizer, in ``tmp``."""
    from testbed.tiny_models import write_tiny
    return str(write_tiny(Path(tmp) / "moe-qwen3.gguf", default_model_path(), **MOE_SHAPE))


def draft_model(model, tmp, layers=0):
    """The coordinator's draft: ``model``'s weights under another name, or with
    ``layers`` its first that many blocks only (a smaller draft that agrees less)."""
    from testbed.tiny_models import renamed_copy, truncated_copy
    out = Path(tmp) / "draft.gguf"
    return truncated_copy(model, out, layers) if layers else renamed_copy(model, out)


def random_8b(layers, out_dir):
    """bench/gpu_models.py's Llama-3-8B shape with ``layers`` blocks, random Q8_0
    weights and the bundled model's tokenizer, written to ``out_dir``: its path."""
    from dataclasses import replace

    from bench import gpu_models
    shape = replace(gpu_models.LLAMA3_8B, name=f"llama3-8b-random-{layers}l", layers=layers)
    path = Path(out_dir) / f"{shape.name}.Q8_0.gguf"
    if not path.exists():
        gpu_models.write_model(path, shape, str(default_model_path()), gpu_models.Q8_0, seed=1)
    return path
