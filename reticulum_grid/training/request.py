"""The ``genome/train`` request: schema and validation before anything runs.

Request map (msgpack)::

    {"base": model alias or blob id, "dataset": dataset alias or blob id (on the tower),
     "output_alias": str, "rank": int = 8, "alpha": float = 16, "dropout": float = 0,
     "target_modules": [str] = ["q_proj", "k_proj", "v_proj", "o_proj"],
     "learning_rate": float = 2e-4, "epochs": int | "max_steps": int (default 1 epoch),
     "seq_len": int = 512, "batch_size": int = 4, "seed": int = 0, "checkpoint_every": int = 50,
     "notify": LXMF address (16 bytes or 32 hex) | None = the submitter's own address,
     "towers": [tower destination hash, 32 hex] = [] (more towers to train on with this one,
               data-parallel; this tower coordinates as rank 0; see training/distributed.py),
     "modules_to_save": [] (refused: a GGUF LoRA cannot carry them), "use_dora": False (refused),
     "submit_id": int 0..2^63-1 (a random number the client picks, so a request it sends
                  again after a lost reply is told apart from a second job; see tower/replies.py)}

With ``towers`` the global batch is still ``batch_size`` examples (the ranks
share it), so ``batch_size`` must be at least the number of towers.

Unlike peft, which skips misspelled target modules as long as one matches, every
target must name a linear layer the base model has. The dataset must parse.
Reply: ``{"job_id": str}`` at once.
"""

import os
from collections.abc import Collection
from typing import Any

from links.wire import Code, Field, WireError, in_range, max_len, validate
from reticulum_grid.store.names import check_alias
from reticulum_grid.training.datasets import DatasetError, read_examples
from reticulum_grid.store.gguf_info import LINEAR_TARGETS

PEFT_SUFFIX = ".peft"
#: Bytes of a dataset checked before a job is accepted; the worker checks the rest.
QUICK_CHECK_BYTES = 16 << 20
#: Most towers (ranks) one job may use.
MAX_TOWERS = 16

SCHEMA = {
    "base": Field(str, required=True, check=max_len(128)),
    "dataset": Field(str, required=True, check=max_len(128)),
    "output_alias": Field(str, required=True),
    "rank": Field(int, default=8, check=in_range(1, 1024)),
    "alpha": Field(float, default=16.0, check=in_range(1e-3, 1e5)),
    "dropout": Field(float, default=0.0, check=in_range(0.0, 0.9)),
    "target_modules": Field(list, default=["q_proj", "k_proj", "v_proj", "o_proj"], check=max_len(64)),
    "learning_rate": Field(float, default=2e-4, check=in_range(1e-8, 1.0)),
    "epochs": Field(int, check=in_range(1, 10_000)),
    "max_steps": Field(int, check=in_range(1, 10_000_000)),
    "seq_len": Field(int, default=512, check=in_range(8, 1 << 17)),
    "batch_size": Field(int, default=4, check=in_range(1, 4096)),
    "seed": Field(int, default=0, check=in_range(0, (1 << 32) - 1)),
    "checkpoint_every": Field(int, default=50, check=in_range(1, 10_000_000)),
    "notify": Field((bytes, str)),
    "modules_to_save": Field(list, default=[]),
    "use_dora": Field(bool, default=False),
    "towers": Field(list, default=[], check=max_len(MAX_TOWERS - 1)),
    "submit_id": Field(int, check=in_range(0, (1 << 63) - 1)),
}


def parse(request: dict[str, Any], base_modules: Collection[str],
          dataset_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Validated spec (a dict) from an unpacked request. ``base_modules``: the
    linear modules the base model has; ``dataset_path``: the dataset file.
    Raises WireError(bad_request)."""
    r = validate(request, SCHEMA)
    check_alias(r["output_alias"])
    check_alias(r["output_alias"] + PEFT_SUFFIX)  # the PEFT copy is published as "<alias>.peft"
    if r["modules_to_save"]:
        raise WireError(Code.BAD_REQUEST, "modules_to_save cannot be carried by a GGUF LoRA; "
                                          "train LoRA on linear layers only")
    if r["use_dora"]:
        raise WireError(Code.BAD_REQUEST, "DoRA adapters cannot be converted to a GGUF LoRA")
    if r["epochs"] and r["max_steps"]:
        raise WireError(Code.BAD_REQUEST, "give epochs or max_steps, not both")
    _check_targets(r["target_modules"], base_modules)
    try:
        read_examples(dataset_path, max_bytes=QUICK_CHECK_BYTES)
    except DatasetError as e:
        raise WireError(Code.BAD_REQUEST, f"dataset: {e}") from None
    r["notify"] = _notify(r["notify"])
    r["towers"] = _towers(r["towers"], r["batch_size"])
    del r["submit_id"]  # it only tells requests apart; the job does not need it
    if not r["epochs"] and not r["max_steps"]:
        r["epochs"] = 1
    return r


def _check_targets(targets: list[Any], base_modules: Collection[str]) -> None:
    if not targets:
        raise WireError(Code.BAD_REQUEST, "target_modules is empty")
    for t in targets:
        if not isinstance(t, str):
            raise WireError(Code.BAD_REQUEST, "target_modules must be strings")
        if t in ("embed_tokens", "lm_head"):
            raise WireError(Code.BAD_REQUEST, f"target {t!r}: a GGUF LoRA carries only linear layers "
                                              f"({', '.join(LINEAR_TARGETS)})")
        if t not in base_modules:
            raise WireError(Code.BAD_REQUEST, f"unknown target module {t!r}; this base model has: "
                                              f"{', '.join(sorted(base_modules))}")


def _notify(value: bytes | str | None) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes) and len(value) == 16:
        return value
    if isinstance(value, str) and len(value.strip("<>")) == 32:
        try:
            return bytes.fromhex(value.strip("<>"))
        except ValueError:
            pass
    raise WireError(Code.BAD_REQUEST, "notify must be an LXMF address (16 bytes or 32 hex characters)")


def _towers(value: list[Any], batch_size: int) -> list[str]:
    towers: list[str] = []
    for t in value:
        if not isinstance(t, str) or len(t) != 32:
            raise WireError(Code.BAD_REQUEST, "towers must be tower destination hashes (32 hex characters)")
        try:
            bytes.fromhex(t)
        except ValueError:
            raise WireError(Code.BAD_REQUEST, f"towers: {t!r} is not hex") from None
        if t.lower() not in towers:
            towers.append(t.lower())
    if len(towers) + 1 > batch_size:
        raise WireError(Code.BAD_REQUEST, f"{len(towers) + 1} towers share a global batch of {batch_size} "
                                          "examples: give a batch_size of at least the number of towers")
    return towers
