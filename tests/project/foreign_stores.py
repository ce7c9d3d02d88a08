"""Other tools' model stores, laid out as each tool writes them, from the real
default GGUF (and small GGUFs the gguf library writes here for the cases no
real model on this machine shows: a vision projector, an architecture
llama.cpp lacks).

- Ollama (server/images.go, server/layer.go): ``manifests/registry.ollama.ai/
  library/<model>/<tag>`` is a Docker v2 manifest whose layers name blobs by
  sha256 digest; ``blobs/sha256-<hex>`` holds each layer, the config layer a
  JSON of model facts.
- Hugging Face hub cache (huggingface_hub file_download.py): ``models--<org>--
  <repo>/blobs/<sha256>`` holds an LFS file's bytes, ``refs/main`` the commit,
  ``snapshots/<commit>/<file>`` a relative symlink to ``../../blobs/<sha256>``.
- LM Studio: ``models/<publisher>/<model>/<file>.gguf``, a projector
  (``mmproj-*.gguf``) beside the model it serves.
"""

import hashlib
import json
import os
import shutil
from pathlib import Path

import gguf
import numpy as np

OLLAMA_MODEL = "application/vnd.ollama.image.model"
OLLAMA_PROJECTOR = "application/vnd.ollama.image.projector"
OLLAMA_TEMPLATE = "application/vnd.ollama.image.template"


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def ollama_model(store, model, tag, layers, namespace="library", registry="registry.ollama.ai"):
    """Put a model in the Ollama store ``store``: ``layers`` is [(media type,
    file path or text)]. Returns {media type: blob path}."""
    blobs = Path(store) / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    entries, paths = [], {}
    for media_type, content in layers:
        if isinstance(content, Path):
            digest = _sha256(content)
            target = blobs / f"sha256-{digest}"
            shutil.copyfile(content, target)
        else:
            digest = hashlib.sha256(content.encode()).hexdigest()
            target = blobs / f"sha256-{digest}"
            target.write_text(content)
        entries.append({"mediaType": media_type, "digest": f"sha256:{digest}", "size": target.stat().st_size})
        paths[media_type] = target
    config = json.dumps({"model_format": "gguf", "model_family": "llama", "model_families": ["llama"],
                         "file_type": "Q4_1", "architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": [e["digest"] for e in entries]}})
    config_digest = hashlib.sha256(config.encode()).hexdigest()
    (blobs / f"sha256-{config_digest}").write_text(config)
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                           "digest": f"sha256:{config_digest}", "size": len(config)},
                "layers": entries}
    path = Path(store) / "manifests" / registry / namespace / model / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return paths


def hf_model(cache, repo_id, files, commit="5a3b4c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b"):
    """Put ``files`` ({name in the repo: source path}) in the hub cache
    ``cache`` as revision ``commit`` of ``repo_id``, refs/main naming it.
    Returns {name: snapshot path}."""
    repo = Path(cache) / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    out = {}
    for name, source in files.items():
        etag = _sha256(source)
        shutil.copyfile(source, repo / "blobs" / etag)
        link = repo / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(repo / "blobs" / etag, link.parent))
        out[name] = link
    return out


def lmstudio_model(folder, publisher, model, files):
    """Copy ``files`` ({file name: source path}) into LM Studio's models folder. Returns their paths."""
    target = Path(folder) / publisher / model
    target.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        shutil.copyfile(source, target / name)
    return [target / name for name in files]


def write_gguf(path, arch, tokenizer_source=None):
    """A small GGUF of architecture ``arch`` with one f32 tensor per kind a
    projector or a model has (and the real model's tokenizer, when given)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if tokenizer_source is not None:
        src = gguf.GGUFReader(tokenizer_source)
        for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens"):
            field = src.fields[key]
            w.add_key_value(key, field.contents(), field.types[0],
                            sub_type=field.types[1] if len(field.types) > 1 else None)
    prefix = "v.blk.0" if arch == "clip" else "blk.0"
    w.add_tensor(f"{prefix}.attn_q.weight", np.zeros((8, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
