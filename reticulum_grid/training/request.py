"""The ``genome/train`` request: one frozen ``TrainRequest`` from the CLI and the
gateway through the client to the tower, checked when it is made.

Request map (msgpack; ``TrainRequest.to_map`` / ``from_map``)::

    {"base": model alias or blob id, "dataset": dataset alias or blob id (on the tower),
     "output_alias": str, "rank": int = 8, "alpha": float = 16, "dropout": float = 0,
     "target_modules": [str] = ["q_proj", "k_proj", "v_proj", "o_proj"],
     "learning_rate": float = 2e-4, "epochs": int | "max_steps": int (default 1 epoch),
     "seq_len": int = 512, "batch_size": int = 4, "seed": int = 0, "checkpoint_every": int = 50,
     "notify": LXMF address (16 bytes or 32 hex) | None = the submitter's own address,
     "towers": [tower destination hash, 32 hex] = [] (more towers to train on with this one,
               data-parallel; this tower coordinates as rank 0; see training/distributed.py),
     "sync": "auto" | "ddp" | "local" = "auto" (how towers sync; training/outer.py),
     "local_steps": int | None (H, steps between averages in local mode; None: chosen by the link),
     "outer_lr": float = 1.0, "outer_momentum": float = 0.0 (the outer SGD of local mode, Nesterov
                 with momentum; the defaults average the replicas; DiLoCo's 0.7 and 0.9: training/outer.py),
     "freeze_a": bool = False (train only LoRA's B: averages exactly, half the bytes),
     "modules_to_save": [] (refused: a GGUF LoRA cannot carry them), "use_dora": False (refused),
     "submit_id": int 0..2^63-1 (a random number the client picks, so a request it sends
                  again after a lost reply is told apart from a second job; see tower/replies.py)}

With ``towers`` the global batch is still ``batch_size`` examples (the ranks
share it), so ``batch_size`` must be at least the number of towers.

What only the tower can check waits for it (``TrainRequest.check_on``): unlike
peft, which skips misspelled target modules as long as one matches, every
target must name a linear layer the base model has, and the dataset must parse.
The tower's job spec (``job_spec``) is a new map built from the request, never
the request changed. Reply: ``{"job_id": str}`` at once.
"""

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields
from typing import Any, Self

from links.wire import Code, Field, WireError, in_range, max_len, validate
from reticulum_grid.store.names import check_alias
from reticulum_grid.training.datasets import DatasetError, read_examples
from reticulum_grid.training.outer import OUTER_LR, OUTER_MOMENTUM, SYNC_MODES
from reticulum_grid.store.gguf_info import LINEAR_TARGETS

PEFT_SUFFIX = ".peft"
#: Bytes of a dataset checked before a job is accepted; the worker checks the rest.
QUICK_CHECK_BYTES = 16 << 20
#: Most towers (ranks) one job may use.
MAX_TOWERS = 16
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")

SCHEMA = {
    "base": Field(str, required=True, check=max_len(128)),
    "dataset": Field(str, default="", check=lambda v: None if len(v) <= 128 else f"length {len(v)} over 128"),
    "output_alias": Field(str, required=True),
    "rank": Field(int, default=8, check=in_range(1, 1024)),
    "alpha": Field(float, default=16.0, check=in_range(1e-3, 1e5)),
    "dropout": Field(float, default=0.0, check=in_range(0.0, 0.9)),
    "target_modules": Field((list, tuple), default=DEFAULT_TARGETS, check=max_len(64)),
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
    "towers": Field((list, tuple), default=(), check=lambda v: None if len(v) < MAX_TOWERS else
                    f"{len(v)} towers, at most {MAX_TOWERS - 1} beside the coordinator"),
    "submit_id": Field(int, check=in_range(0, (1 << 63) - 1)),
    "sync": Field(str, default="auto", check=lambda v: None if v in SYNC_MODES else
                  f"{v[:16]!r} is not one of {', '.join(SYNC_MODES)}"),
    "local_steps": Field(int, check=in_range(1, 100_000)),
    "outer_lr": Field(float, default=OUTER_LR, check=in_range(1e-4, 10.0)),
    "outer_momentum": Field(float, default=OUTER_MOMENTUM, check=in_range(0.0, 0.999)),
    "freeze_a": Field(bool, default=False),
}


@dataclass(frozen=True, kw_only=True)
class TrainRequest:
    """A LoRA training request (the module doc gives each field). Checked
    when made, never changed: derive another with ``dataclasses.replace``,
    which checks it again. ``dataset`` is "" until the client has sent a local
    file (the tower refuses a request without one). ``epochs`` and
    ``max_steps`` both None: one epoch. Raises WireError(bad_request)."""
    base: str
    output_alias: str
    dataset: str = ""
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = DEFAULT_TARGETS
    learning_rate: float = 2e-4
    epochs: int | None = None
    max_steps: int | None = None
    seq_len: int = 512
    batch_size: int = 4
    seed: int = 0
    checkpoint_every: int = 50
    notify: bytes | None = None
    towers: tuple[str, ...] = ()
    submit_id: int | None = None
    sync: str = "auto"
    local_steps: int | None = None
    outer_lr: float = OUTER_LR
    outer_momentum: float = OUTER_MOMENTUM
    freeze_a: bool = False

    def __post_init__(self) -> None:
        validate(self.to_map(), SCHEMA)
        check_alias(self.output_alias)
        check_alias(self.output_alias + PEFT_SUFFIX)  # the PEFT copy is published as "<alias>.peft"
        if self.epochs and self.max_steps:
            raise WireError(Code.BAD_REQUEST, "give epochs or max_steps, not both")
        _check_target_names(self.target_modules)
        if _notify(self.notify) != self.notify:
            raise WireError(Code.BAD_REQUEST, "notify must be an LXMF address of 16 bytes")
        if _towers(self.towers, self.batch_size) != list(self.towers):
            raise WireError(Code.BAD_REQUEST, "towers must be distinct lower-case hashes (32 hex characters)")

    @classmethod
    def from_map(cls, raw: Mapping[Any, Any]) -> Self:
        """A request from its wire map (or the CLI's and the gateway's options):
        unknown keys, wrong types and values out of range are refused, hex
        ``notify`` and upper-case ``towers`` are read as the request means them.
        Raises WireError(bad_request)."""
        if not isinstance(raw, Mapping):
            raise WireError(Code.BAD_REQUEST, f"a train request is a map, not {type(raw).__name__}")
        r = validate(raw, SCHEMA)
        if r["modules_to_save"]:
            raise WireError(Code.BAD_REQUEST, "modules_to_save cannot be carried by a GGUF LoRA; "
                                              "train LoRA on linear layers only")
        if r["use_dora"]:
            raise WireError(Code.BAD_REQUEST, "DoRA adapters cannot be converted to a GGUF LoRA")
        known = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in r.items() if k in known}, "target_modules": tuple(r["target_modules"]),
                      "notify": _notify(r["notify"]), "towers": tuple(_towers(r["towers"], r["batch_size"]))})

    def to_map(self) -> dict[str, Any]:
        """The wire map (None, "" and no towers left out)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and value != "" and value != ():
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def check_on(self, base_modules: Collection[str], dataset_path: str | os.PathLike[str]) -> None:
        """What only the tower can check: ``base_modules`` (the linear modules its
        base model has) hold every target, and ``dataset_path`` (the dataset
        file) parses. Raises WireError(bad_request)."""
        for t in self.target_modules:
            if t not in base_modules:
                raise WireError(Code.BAD_REQUEST, f"unknown target module {t!r}; this base model has: "
                                                  f"{', '.join(sorted(base_modules))}")
        try:
            read_examples(dataset_path, max_bytes=QUICK_CHECK_BYTES)
        except DatasetError as e:
            raise WireError(Code.BAD_REQUEST, f"dataset: {e}") from None

    def job_spec(self, **tower: Any) -> dict[str, Any]:
        """The job spec as training/trainer.py reads it (JSON, kept with the
        job): the training fields, one epoch when no length was given, and
        what the ``tower`` adds (base_path, dataset_path, towers, owner, ...).
        ``notify``, ``towers`` and ``submit_id`` stay with the request."""
        spec = {k: v for k, v in self.to_map().items() if k not in ("notify", "towers", "submit_id")}
        spec.setdefault("max_steps", None)
        spec.setdefault("epochs", None if self.max_steps else 1)
        return {**spec, **tower}


def _check_target_names(targets: tuple[Any, ...]) -> None:
    if not targets:
        raise WireError(Code.BAD_REQUEST, "target_modules is empty")
    for t in targets:
        if not isinstance(t, str):
            raise WireError(Code.BAD_REQUEST, "target_modules must be strings")
        if t in ("embed_tokens", "lm_head"):
            raise WireError(Code.BAD_REQUEST, f"target {t!r}: a GGUF LoRA carries only linear layers "
                                              f"({', '.join(LINEAR_TARGETS)})")


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


def _towers(value: list[Any] | tuple[Any, ...], batch_size: int) -> list[str]:
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
