"""Training state as safetensors bytes: tensors, plus a JSON tree for the rest. Never pickle.

A checkpoint holds the LoRA weights, the optimizer and scheduler state, the
RNG state and the step. ``torch.save`` pickles it, and unpickling runs
whatever code the bytes name: a checkpoint sent from rank 0 to the other
ranks crosses a network, and one on disk may have been written by anyone who
could write there. So the state is packed as a safetensors file (tensors
only, by the library's own design) whose metadata ``tree`` is JSON describing
every other value, each tagged::

    {"t": "t0"}             the tensor named t0 in the file
    {"v": 3} / {"v": null}  a number, string, bool or null
    {"l": [...]}            a list; {"u": [...]} a tuple
    {"d": [[key, value], ...]}   a dict (keys encoded the same way: optimizer
                                 state is keyed by parameter index, an int)

Decoding accepts only those tags (CheckpointError otherwise), so the worst a
hostile state can do is hold wrong numbers.
"""

import json
import os
from pathlib import Path
from typing import Any

#: Nesting a state may have (optimizer state dicts are 4 deep).
MAX_DEPTH = 16
#: Largest safetensors header accepted (bytes).
MAX_HEADER_BYTES = 64 << 20


class CheckpointError(ValueError):
    pass


def pack(state: object) -> bytes:
    """``state`` (nested dicts/lists/tuples of tensors, numbers, strings, bools,
    None) as safetensors bytes. Raises CheckpointError for anything else."""
    from safetensors.torch import save

    tensors: dict[str, Any] = {}

    def encode(obj: Any, depth: int) -> dict[str, Any]:
        if depth > MAX_DEPTH:
            raise CheckpointError(f"state nested deeper than {MAX_DEPTH}")
        if hasattr(obj, "detach") and hasattr(obj, "dtype"):  # a torch tensor
            name = f"t{len(tensors)}"
            tensors[name] = obj.detach().cpu().contiguous().clone()
            return {"t": name}
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return {"v": obj}
        if isinstance(obj, dict):
            return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in obj.items()]}
        if isinstance(obj, (list, tuple)):
            return {"l" if isinstance(obj, list) else "u": [encode(x, depth + 1) for x in obj]}
        raise CheckpointError(f"a checkpoint cannot hold a {type(obj).__name__}")

    tree = encode(state, 0)
    return save(tensors, metadata={"tree": json.dumps(tree)})


def unpack(data: bytes) -> Any:
    """The state ``pack`` made ``data`` (bytes) from. Raises CheckpointError."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    if len(data) < 8:
        raise CheckpointError("not a safetensors checkpoint (too short)")
    size = int.from_bytes(data[:8], "little")
    if size > min(MAX_HEADER_BYTES, len(data) - 8):
        raise CheckpointError("not a safetensors checkpoint (bad header size)")
    try:
        header = json.loads(data[8:8 + size])
        tree = json.loads(header["__metadata__"]["tree"])
        tensors = load(bytes(data))
    except (ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as e:
        raise CheckpointError(f"not a checkpoint: {type(e).__name__}: {e}") from None

    def decode(node: object, depth: int) -> Any:
        if depth > MAX_DEPTH or not isinstance(node, dict) or len(node) != 1:
            raise CheckpointError("bad checkpoint tree")
        (tag, value), = node.items()
        if tag == "t" and isinstance(value, str) and value in tensors:
            return tensors[value]
        if tag == "v" and (value is None or isinstance(value, (bool, int, float, str))):
            return value
        if tag in ("l", "u") and isinstance(value, list):
            items = [decode(x, depth + 1) for x in value]
            return items if tag == "l" else tuple(items)
        if tag == "d" and isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 for p in value):
            out: dict[Any, Any] = {}
            for k, v in value:
                key = decode(k, depth + 1)
                if not isinstance(key, (bool, int, float, str)) and key is not None:
                    raise CheckpointError("bad checkpoint tree: a dict key that is not a plain value")
                out[key] = decode(v, depth + 1)
            return out
        raise CheckpointError(f"bad checkpoint tree: tag {tag!r}")

    return decode(tree, 0)


def save(path: str | os.PathLike[str], state: object) -> None:
    """Write ``state`` to ``path`` atomically (mode 0600)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pack(state))
    os.replace(tmp, path)


def load(path: str | os.PathLike[str]) -> Any:
    """The state in the checkpoint file at ``path``. Raises CheckpointError or OSError."""
    return unpack(Path(path).read_bytes())
