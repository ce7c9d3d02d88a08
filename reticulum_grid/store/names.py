"""Names in the blob store: kinds, aliases, blob ids, and the GGUF content check.

Pure functions and constants, shared by the store, sync, training requests and the CLI.
"""

import os
import re

from links import manifest as mf
from links.wire import Code, WireError

#: model: a GGUF model; adapter: a GGUF LoRA llama.cpp loads; peft: the same
#: adapter as PEFT safetensors; dataset: training data (JSONL); file: anything else.
KINDS = ("model", "adapter", "peft", "dataset", "file")
#: Aliases travel in caps, whose decoder takes at most 32 bytes (announce/caps.py).
ALIAS_MAX = 32
ALIAS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,%d}" % (ALIAS_MAX - 1))
HEX_RE = re.compile(r"[0-9a-fA-F]{8,64}")

def is_blob_id_prefix(name: object) -> bool:
    """True when ``name`` reads as a blob id or a prefix of one (8-64 hex digits)."""
    return isinstance(name, str) and HEX_RE.fullmatch(name) is not None


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
    """Raise WireError(bad_request) unless ``alias`` is a safe name: no path
    parts, and never something that reads as a blob id (8+ hex digits)."""
    if (not isinstance(alias, str) or not ALIAS_RE.fullmatch(alias) or ".." in alias
            or is_blob_id_prefix(alias)):
        raise WireError(Code.BAD_REQUEST, f"alias {alias!r} must be 1-{ALIAS_MAX} of A-Z a-z 0-9 . _ : + - "
                                          "(no path separators, no '..', not only hex digits)")
    return alias


def parse_blob_id(value: object) -> bytes:
    """32-byte blob id from bytes or 64 hex characters; WireError(bad_request) otherwise."""
    if isinstance(value, bytes) and len(value) == mf.HASH_BYTES:
        return value
    if isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]{64}", value):
        return bytes.fromhex(value)
    raise WireError(Code.BAD_REQUEST, "a blob id is 32 bytes (64 hex characters)")
