"""Names in the blob store: kinds, aliases, blob ids, and the GGUF content check.

Pure functions and constants, shared by the store, sync, training requests and the CLI.
"""

import os
import re

# The alias rule is announce/aliases.py's, shared with the config and the caps decoder.
from announce.aliases import alias_problem, is_blob_id_prefix  # noqa: F401 (is_blob_id_prefix: for the store's users)
from links import manifest as mf
from links.wire import Code, WireError

#: model: a GGUF model; adapter: a GGUF LoRA llama.cpp loads; peft: the same
#: adapter as PEFT safetensors; dataset: training data (JSONL); file: anything else.
KINDS = ("model", "adapter", "peft", "dataset", "file")


#: Kinds whose files llama.cpp opens: they must start with the GGUF magic
#: (b"GGUF", ggml's docs/gguf.md), or a stray text file would be served as a model.
GGUF_KINDS = ("model", "adapter")


def is_gguf(path: str | os.PathLike[str]) -> bool:
    """True when the file at ``path`` starts with the GGUF magic."""
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def check_content(path: str | os.PathLike[str], kind: str | None) -> None:
    """Raise WireError(bad_request) when ``kind`` needs a GGUF file and ``path`` is not one."""
    if kind in GGUF_KINDS and not is_gguf(path):
        raise WireError(Code.BAD_REQUEST, f"a {kind} blob must be a GGUF file and this one is not; "
                                          "use kind 'file' (or 'dataset') for other files")


def check_alias(alias: object) -> str:
    """``alias`` when it is a usable alias (announce/aliases.py: no path
    parts, never something that reads as a blob id); else raises
    WireError(bad_request) saying why."""
    problem = alias_problem(alias)
    if problem or not isinstance(alias, str):  # alias_problem refuses a non-str: the test is for the type checker
        raise WireError(Code.BAD_REQUEST, problem or f"alias {alias!r} is not text")
    return alias


def parse_blob_id(value: object) -> bytes:
    """32-byte blob id from bytes or 64 hex characters; WireError(bad_request) otherwise."""
    if isinstance(value, bytes) and len(value) == mf.HASH_BYTES:
        return value
    if isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]{64}", value):
        return bytes.fromhex(value)
    raise WireError(Code.BAD_REQUEST, "a blob id is 32 bytes (64 hex characters)")
