"""The llama.cpp tree a GPU machine builds from, trimmed to what its CMake build reads.

The pinned llama-cpp-python sdist (``[tool.rngrid.llama]``) vendors the whole
llama.cpp tree; scripts/gpu_pack.py carries only what CMake needs to build
``llama-server`` and ``ggml-rpc-server`` with the CPU, CUDA and RPC backends:
no web UI sources, tests, docs, vocabularies, models or other backends
(``keep_llama``). ``check_trimmed`` says what a trimmed tar.gz lacks or holds
that it should not.
"""

import re
import sys
import tarfile
from pathlib import Path

from scripts.llama_build import fetch_source, llama_cache, pinned_source

#: Top-level parts of the llama.cpp tree the CMake build of llama-server and
#: ggml-rpc-server reads (the rest: docs, models, tests, examples, gguf-py, ...).
LLAMA_KEEP = ("CMakeLists.txt", "LICENSE", "licenses/", "cmake/", "include/", "src/", "common/", "vendor/",
              "ggml/CMakeLists.txt", "ggml/cmake/", "ggml/include/", "ggml/src/", "tools/",
              "scripts/ui-assets.cmake")
#: ggml backends built: the CPU (always), CUDA and RPC. Every other ggml/src/ggml-*/ folder goes.
LLAMA_BACKENDS = ("ggml-cpu", "ggml-cuda", "ggml-rpc")
#: Of the web UI only what CMake reads with the UI off (an empty asset table).
LLAMA_UI_KEEP = ("tools/ui/CMakeLists.txt", "tools/ui/ui.cpp.in", "tools/ui/ui.h.in")
#: Paths never needed inside kept folders: tests, benchmarks, sample media, docs.
LLAMA_DROP = re.compile(r"(^|/)(tests?|bench|legacy-models)/|(^|/)test-[^/]*\.(jpe?g|png|mp3|mp4|wav)$|"
                        r"\.(md|py|sh|ps1|bat|txt)$")
#: Files the build cannot do without; a pack missing one is refused.
LLAMA_REQUIRED = ("CMakeLists.txt", "ggml/CMakeLists.txt", "ggml/src/ggml-cuda/CMakeLists.txt",
                  "ggml/src/ggml-cuda/ggml-cuda.cu", "ggml/src/ggml-rpc/ggml-rpc.cpp", "tools/server/server.cpp",
                  "tools/rpc/rpc-server.cpp", "tools/ui/CMakeLists.txt", "scripts/ui-assets.cmake")
#: Paths a trimmed tree must not hold (the test checks the trim left them out).
LLAMA_ABSENT = ("tools/ui/src/", "docs/", "models/", "tests/", "examples/", "ggml/src/ggml-vulkan/",
                "ggml/src/ggml-metal/", "gguf-py/")


def keep_llama(rel):
    """True when the llama.cpp file at ``rel`` (a posix path inside the tree) goes into the pack."""
    if not any(rel == k or (k.endswith("/") and rel.startswith(k)) for k in LLAMA_KEEP):
        return False
    if rel.startswith("ggml/src/ggml-"):
        folder = rel.split("/")[2]
        if "/" in rel[len("ggml/src/"):] and folder not in LLAMA_BACKENDS:
            return False
    if rel.startswith("tools/ui/"):
        return rel in LLAMA_UI_KEEP
    if rel in LLAMA_KEEP or rel.startswith(("licenses/", "cmake/")) or rel.endswith(("CMakeLists.txt", ".cmake")):
        return True
    return not LLAMA_DROP.search(rel)


def llama_tree(source=None):
    """The llama.cpp tree to trim: ``source``, else the pinned sdist's (fetched once, into
    llama_build's cache)."""
    if source:
        return Path(source)
    pin, sha = pinned_source()
    pip = str(Path(sys.executable).parent / "pip")
    return fetch_source(pip, pin, sha, llama_cache())


def trim_llama(tree, out):
    """Write the kept files of ``tree`` to the tar.gz ``out`` (sorted, fixed
    times and owners). Returns (files, bytes before compression)."""
    tree = Path(tree)
    files = sorted(p for p in tree.rglob("*") if p.is_file() and not p.is_symlink()
                   and keep_llama(p.relative_to(tree).as_posix()))
    total = 0
    with tarfile.open(out, "w:gz", compresslevel=6) as tar:
        for path in files:
            info = tar.gettarinfo(str(path), arcname="llama.cpp/" + path.relative_to(tree).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(path, "rb") as f:
                tar.addfile(info, f)
            total += info.size
    return len(files), total


def check_trimmed(tar_path):
    """What is wrong with the trimmed tree in the tar.gz ``tar_path`` ([] when nothing):
    a file of LLAMA_REQUIRED missing, a part of LLAMA_ABSENT there, or no readable tar."""
    try:
        with tarfile.open(tar_path) as tar:
            names = {n.removeprefix("llama.cpp/") for n in tar.getnames()}
    except (OSError, tarfile.TarError) as e:
        return [f"{tar_path.name} is not a readable tar.gz: {e}"]
    problems = [f"{tar_path.name} lacks {rel}" for rel in LLAMA_REQUIRED if rel not in names]
    problems += [f"{tar_path.name} holds {prefix} (trimmed trees leave it out)" for prefix in LLAMA_ABSENT
                 if any(n.startswith(prefix) for n in names)]
    return problems

