"""Whether a model another tool keeps (foreign.py) can be served here, and
registering one in place, under the name its tool gives it.

A model is refused, with the reason, when its tool's own record says it is
more than one plain GGUF (an Ollama projector or adapter layer, a split
file), when the file is not a GGUF model (a vision projector, a LoRA
adapter), or when its architecture is not one the vendored llama.cpp loads
(``node.engine.architectures``: the list the build took from llama.cpp's
``src/llama-arch.cpp``). Registering never copies: the store references the
file in place and verifies it again whenever it changes (blobstore.py).

Ollama names each blob by its SHA-256 (``blobs/sha256-<hex>``) and the
Hugging Face cache each LFS file (``blobs/<hex>``): before such a file is
registered (by `rngrid models import`, or by a tower starting with a config
that names it) its bytes are checked against that name, once per size and
mtime the store has not verified, so a copy damaged or rewritten while
nothing watched is refused too.
"""

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from links.wire import Code, WireError
from reticulum_grid.node import engine
from reticulum_grid.store import foreign, gguf_header
from reticulum_grid.store.blobstore import BlobInfo, BlobStore
from reticulum_grid.store.names import check_alias

#: A file its tool names by its SHA-256: Ollama's blobs/sha256-<hex>, the HF cache's blobs/<hex>.
_DIGEST_NAME = re.compile(r"(?:sha256-)?([0-9a-f]{64})")
#: The architecture of a vision projector GGUF (llama.cpp's mtmd, LM Studio's mmproj-*.gguf).
PROJECTOR_ARCH = "clip"


@dataclass(frozen=True)
class Candidate:
    """A found model and what its GGUF says: ``architecture`` and
    ``quantization`` (llama.cpp's file type, "Q4_K_M"), None where unread;
    ``loadable``: the vendored llama.cpp knows the architecture (None: no
    list to ask); ``problem``: why it is not imported, None when it can be."""
    found: foreign.Found
    architecture: str | None = None
    quantization: str | None = None
    loadable: bool | None = None
    problem: str | None = None


def describe(found: foreign.Found, known: frozenset[str] | None = None) -> Candidate:
    """``found`` with its GGUF's facts judged against ``known`` architectures (default: the engine's list)."""
    if found.path is None:
        return Candidate(found, problem=found.problem)
    known = engine.architectures() if known is None else known
    try:
        header = gguf_header.read(found.path)
    except (OSError, ValueError) as e:
        return Candidate(found, problem=found.problem or f"it is not a readable GGUF: {e}")
    loadable = None if known is None else header.arch in known
    return Candidate(found, header.arch, header.quantization, loadable, found.problem or _problem(header, loadable))


def _problem(header: gguf_header.Header, loadable: bool | None) -> str | None:
    if header.arch == PROJECTOR_ARCH:
        return "it is a vision projector (mmproj) for another model, not a model"
    if header.adapter:
        return "it is a LoRA adapter, not a model (rngrid models add PATH --kind adapter takes it)"
    if loadable is False:
        return f"its architecture {header.arch!r} is not one the vendored llama.cpp loads"
    return None


def register(store: BlobStore, candidate: Candidate, alias: str | None = None) -> BlobInfo:
    """Register ``candidate`` in ``store`` in place as a model named ``alias``
    (default: its tool's name). Raises WireError: bad_request (the candidate
    has a problem, or the name is not a usable alias, announce/aliases.py),
    corrupt (check_digest)."""
    found = candidate.found
    if candidate.problem is not None or found.path is None:
        raise WireError(Code.BAD_REQUEST, f"{found.ref} is not imported: {candidate.problem}")
    name = alias or found.name
    try:
        check_alias(name)
    except WireError as e:
        raise WireError(Code.BAD_REQUEST, f"{e.message}; give it another name with --alias") from None
    if not store.verified_in_place(found.path):
        check_digest(found.path)
    return store.add_file(found.path, alias=name, kind="model")


def check_digest(path: Path) -> None:
    """Raise WireError(corrupt) when ``path`` (links followed) is named by a
    SHA-256 its bytes do not have; a file named otherwise passes. Reads it whole."""
    real = path.resolve()
    named = _DIGEST_NAME.fullmatch(real.name)
    if named is None:
        return
    with open(real, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if digest != named.group(1):
        raise WireError(Code.CORRUPT, f"{real} does not hash to the SHA-256 its name gives (another program "
                                      "changed it, or a download broke off); fetch it again with its own tool")


def register_source(store: BlobStore, ref: str, alias: str) -> BlobInfo:
    """Register the model a source name (``ollama:...``, ``hf:...``,
    ``lmstudio:...``; a tower config's ``path``) stands for on this machine
    now, as ``alias``. Raises foreign.SourceError naming the source and why
    it cannot be served."""
    candidate = describe(foreign.resolve(ref, foreign.roots()))
    try:
        return register(store, candidate, alias)
    except WireError as e:
        raise foreign.SourceError(f"{ref} cannot be served: {candidate.problem or e.message}") from None
