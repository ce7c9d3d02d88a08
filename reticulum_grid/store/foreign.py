"""GGUF models other tools keep on this machine: where Ollama, the Hugging
Face hub cache and LM Studio put them, and the name each tool gives them.

Only reads: nothing here writes into another tool's folders.

Ollama (github.com/ollama/ollama, ``server/modelpath.go``, ``server/images.go``)::

    $OLLAMA_MODELS, else ~/.ollama/models and /usr/share/ollama/.ollama/models (its Linux service)
      manifests/<registry>/<namespace>/<model>/<tag>   JSON: {"layers": [{"mediaType", "digest", "size"}]}
      blobs/sha256-<hex>                               each layer, named by its digest

  The layer of media type ``application/vnd.ollama.image.model`` is a plain
  GGUF. Ollama shows ``registry.ollama.ai/library/qwen2.5-coder/32b`` as
  ``qwen2.5-coder:32b``, another namespace as ``namespace/model:tag``, another
  registry as ``registry/namespace/model:tag``; that is the name here too.

Hugging Face hub cache (huggingface_hub's ``constants.py``, "Manage the cache")::

    $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub (~/.cache/huggingface/hub)
      models--<org>--<repo>/refs/main                  the commit a branch is at
      models--<org>--<repo>/snapshots/<commit>/<file>  a relative symlink to ...
      models--<org>--<repo>/blobs/<etag>               ... the file's bytes

  ``hf:org/repo/file.gguf`` names a file of the revision ``refs/main`` names
  (else of the newest snapshot); its name is the file's stem.

LM Studio: ``~/.lmstudio/models/<publisher>/<model>/*.gguf`` (older versions:
``~/.cache/lm-studio/models``), ``lmstudio:publisher/model/file.gguf``, named
by the file's stem. Any other folder: its ``*.gguf`` files, by path.

A GGUF split into parts (``name-00001-of-00003.gguf``, llama.cpp's
gguf-split) is listed once, with the reason it is not imported: the store
holds one file per model.
"""

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

OLLAMA_MODEL = "application/vnd.ollama.image.model"
#: Ollama layers that make a model more than one plain GGUF, and why that keeps it out.
OLLAMA_EXTRA_LAYERS = {
    "application/vnd.ollama.image.projector": "it has a separate vision projector layer (a multimodal model), "
                                              "which towers do not load",
    "application/vnd.ollama.image.adapter": "it has a LoRA adapter layer on top of its weights, which the "
                                            "model layer alone lacks",
}
OLLAMA_REGISTRY, OLLAMA_NAMESPACE = "registry.ollama.ai", "library"
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


class SourceError(ValueError):
    """A source name that names nothing here (the message says what was looked for)."""


@dataclass(frozen=True)
class Roots:
    """The folders each tool's store may be in (only those that exist)."""
    ollama: tuple[Path, ...]
    hf: tuple[Path, ...]
    lmstudio: tuple[Path, ...]


@dataclass(frozen=True)
class Found:
    """One model another tool keeps. ``ref``: what `rngrid models import`
    takes for it; ``name``: the name its tool uses; ``path``: its GGUF (None
    when it has none); ``size``: bytes; ``problem``: why it cannot be
    imported, None when it can."""
    source: str
    ref: str
    name: str
    path: Path | None
    size: int
    problem: str | None = None


def roots(env: Mapping[str, str] | None = None, home: Path | None = None) -> Roots:
    """Where the stores are for environment ``env`` (default os.environ) and home folder ``home``."""
    env = os.environ if env is None else env
    home = Path(env.get("HOME") or Path.home()) if home is None else home
    if env.get("OLLAMA_MODELS"):
        ollama = [Path(env["OLLAMA_MODELS"])]
    else:
        ollama = [home / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]
    hf_home = Path(env.get("HF_HOME") or Path(env.get("XDG_CACHE_HOME") or home / ".cache") / "huggingface")
    hf = Path(env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or hf_home / "hub")
    lmstudio = [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    return Roots(_existing(ollama), _existing([hf]), _existing(lmstudio))


def _existing(paths: list[Path]) -> tuple[Path, ...]:
    return tuple(dict.fromkeys(p for p in paths if p.is_dir()))


def scan(where: Roots) -> list[Found]:
    """Every model in every store of ``where``, by source then name."""
    return [*_ollama_all(where.ollama), *_hf_all(where.hf), *_lmstudio_all(where.lmstudio)]


def scan_dir(folder: Path) -> list[Found]:
    """The GGUF files under ``folder``, named by their stems."""
    return [_file("dir", str(p), p) for p in _ggufs(folder)]


def resolve(ref: str, where: Roots) -> Found:
    """The model ``ref`` names: ``ollama:NAME[:TAG]``, ``hf:ORG/REPO/FILE``,
    ``lmstudio:PUBLISHER/MODEL/FILE`` or a GGUF path. Raises SourceError."""
    source, _, rest = ref.partition(":")
    if source == "ollama":
        return _ollama_one(rest, where.ollama)
    if source == "hf":
        return _hf_one(rest, where.hf)
    if source == "lmstudio":
        return _lmstudio_one(rest, where.lmstudio)
    path = Path(ref).expanduser()
    if not path.is_file():
        raise SourceError(f"{ref} is not a file, nor ollama:NAME, hf:ORG/REPO/FILE or lmstudio:PUBLISHER/MODEL/FILE")
    return _file("dir", str(path.resolve()), path)


# -- Ollama ---------------------------------------------------------------
def _ollama_all(stores: tuple[Path, ...]) -> Iterator[Found]:
    seen = set()
    for store in stores:
        top = store / "manifests"
        for manifest in sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else ():
            parts = manifest.relative_to(top).parts
            if len(parts) == 4 and (name := ollama_name(parts[0], parts[1], parts[2], parts[3])) not in seen:
                seen.add(name)
                yield _ollama_model(store, manifest, name)


def ollama_name(registry: str, namespace: str, model: str, tag: str) -> str:
    """The name Ollama shows for a manifest path's four parts."""
    if registry != OLLAMA_REGISTRY:
        return f"{registry}/{namespace}/{model}:{tag}"
    return f"{model}:{tag}" if namespace == OLLAMA_NAMESPACE else f"{namespace}/{model}:{tag}"


def _ollama_one(name: str, stores: tuple[Path, ...]) -> Found:
    repo, colon, tag = name.rpartition(":")
    if not colon or "/" in tag:
        repo, tag = name, "latest"
    parts = repo.split("/")
    if not all(parts) or len(parts) > 3 or any(p in (".", "..") for p in [*parts, tag]):
        raise SourceError(f"ollama:{name} is not an Ollama model name (model[:tag], namespace/model[:tag])")
    registry, namespace, model = [OLLAMA_REGISTRY, OLLAMA_NAMESPACE][:3 - len(parts)] + parts
    full = ollama_name(registry, namespace, model, tag)
    for store in stores:
        manifest = store / "manifests" / registry / namespace / model / tag
        if manifest.is_file():
            return _ollama_model(store, manifest, full)
    where = ", ".join(map(str, stores)) or "no Ollama store here (set OLLAMA_MODELS)"
    raise SourceError(f"Ollama has no model {full} (looked in {where})")


def _ollama_model(store: Path, manifest: Path, name: str) -> Found:
    ref = f"ollama:{name}"
    try:
        layers = json.loads(manifest.read_text())["layers"]
        kinds = {layer["mediaType"]: layer for layer in layers}
    except (OSError, ValueError, KeyError, TypeError) as e:
        return Found("ollama", ref, name, None, 0, f"its manifest {manifest} is unreadable: {e}")
    model = kinds.get(OLLAMA_MODEL)
    if model is None:
        return Found("ollama", ref, name, None, 0, "it has no model layer")
    path = store / "blobs" / str(model.get("digest", "")).replace(":", "-")
    size = model.get("size") if isinstance(model.get("size"), int) else 0
    if not path.is_file():
        return Found("ollama", ref, name, None, size, f"its model layer {path.name} is not in {store / 'blobs'}")
    extra = next((why for kind, why in OLLAMA_EXTRA_LAYERS.items() if kind in kinds), None)
    return Found("ollama", ref, name, path, path.stat().st_size, extra)


# -- Hugging Face ---------------------------------------------------------
def _hf_all(caches: tuple[Path, ...]) -> Iterator[Found]:
    for cache in caches:
        for repo in sorted(cache.glob("models--*--*")):
            snapshot = _hf_snapshot(repo)
            if snapshot is not None:
                repo_id = repo.name.removeprefix("models--").replace("--", "/")
                for path in _ggufs(snapshot):
                    yield _file("hf", f"hf:{repo_id}/{path.relative_to(snapshot).as_posix()}", path)


def _hf_snapshot(repo: Path) -> Path | None:
    """The snapshot refs/main names, else the newest one, else None."""
    try:
        main = repo / "snapshots" / (repo / "refs" / "main").read_text().strip()
        if main.is_dir():
            return main
    except (OSError, ValueError):
        pass
    snapshots = [p for p in (repo / "snapshots").glob("*") if p.is_dir()]
    return max(snapshots, key=lambda p: p.stat().st_mtime) if snapshots else None


def _hf_one(name: str, caches: tuple[Path, ...]) -> Found:
    parts = name.split("/")
    if len(parts) < 3 or not all(parts) or any(p in (".", "..") for p in parts) or not name.endswith(".gguf"):
        raise SourceError(f"hf:{name} is not hf:ORG/REPO/FILE.gguf")
    for cache in caches:
        repo = cache / f"models--{parts[0]}--{parts[1]}"
        snapshot = _hf_snapshot(repo) if repo.is_dir() else None
        if snapshot is not None and snapshot.joinpath(*parts[2:]).is_file():
            return _file("hf", f"hf:{name}", snapshot.joinpath(*parts[2:]))
    where = ", ".join(map(str, caches)) or "no Hugging Face cache here (set HF_HUB_CACHE)"
    raise SourceError(f"the Hugging Face cache has no {'/'.join(parts[2:])} of {parts[0]}/{parts[1]} "
                      f"(looked in {where})")


# -- LM Studio and folders ------------------------------------------------
def _lmstudio_all(folders: tuple[Path, ...]) -> Iterator[Found]:
    for folder in folders:
        for path in _ggufs(folder):
            yield _file("lmstudio", f"lmstudio:{path.relative_to(folder).as_posix()}", path)


def _lmstudio_one(name: str, folders: tuple[Path, ...]) -> Found:
    parts = name.split("/")
    if not all(parts) or any(p in (".", "..") for p in parts) or not name.endswith(".gguf"):
        raise SourceError(f"lmstudio:{name} is not lmstudio:PUBLISHER/MODEL/FILE.gguf")
    for folder in folders:
        if folder.joinpath(*parts).is_file():
            return _file("lmstudio", f"lmstudio:{name}", folder.joinpath(*parts))
    raise SourceError(f"LM Studio has no {name} (looked in {', '.join(map(str, folders)) or 'no LM Studio folder'})")


def _ggufs(folder: Path) -> list[Path]:
    """GGUF files under ``folder``, the first part of a split model only."""
    found = []
    for path in sorted(folder.rglob("*.gguf")):
        split = _SPLIT.search(path.name)
        if path.is_file() and (split is None or int(split.group(1)) == 1):
            found.append(path)
    return found


def _file(source: str, ref: str, path: Path) -> Found:
    name = path.name.removesuffix(".gguf")
    split = _SPLIT.search(path.name)
    problem = None
    if split:
        name = path.name[:split.start()]
        problem = (f"it is split into {int(split.group(2))} files; merge them (llama-gguf-split --merge) and "
                   "import the merged file")
    return Found(source, ref, name, path, path.stat().st_size, problem)
