"""The GPU pack: what a lent GPU machine with no network lacks, in one folder.

That machine (CPython 3.12 on x86-64 Linux with PyTorch, transformers, peft,
the CUDA toolkit, CMake and ninja: scripts/gpu_image_packages.txt lists its
Python packages) reaches no package index and no model hub, and everything it
gets travels with the checkout, 64 MiB in all. ``make gpu-pack`` writes
``.gpu-pack/`` (ignored by git), kept under ``PACK_LIMIT_BYTES``:

- ``llama.cpp.tar.gz``: the llama.cpp tree that the pinned llama-cpp-python
  sdist vendors (``[tool.rngrid.llama]``), trimmed to what CMake needs to
  build ``llama-server`` and ``ggml-rpc-server`` with the CPU, CUDA and RPC
  backends (scripts/llama_trim.py);
- ``wheels/``: a wheel of every runtime dependency of this project missing
  from that image, and of their dependencies in turn, for CPython 3.12
  manylinux x86-64, at the versions installed here; and a wheel of the
  project itself (scripts/gpu_wheels.py);
- ``tokenizer.gguf``: the bundled model's tokenizer alone (no weights), so
  that models written there with the gguf library speak its vocabulary;
- ``manifest.json``: every file with its SHA-256 and why it is there.

Wheels are downloaded once into ``~/.cache/rngrid/gpu-wheels`` (``RNGRID_WHEEL_CACHE``
moves it); ``--offline`` takes them from there only and never touches a
network (the test suite's dry run). ``--check DIR`` checks a pack without
making one, against the wheels' own metadata: on the GPU machine too.

Usage: python scripts/gpu_pack.py [--out .gpu-pack] [--offline] [--source DIR]
       python scripts/gpu_pack.py --check DIR
Run with the project's venv Python (it reads the installed versions).
"""

import argparse
import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a file by make: scripts/ is importable from the checkout

from scripts.gpu_wheels import (IMAGE_PACKAGES, PYTHON, fetch_wheel, image_packages,  # noqa: E402
                                installed_requires, installed_version, needed, project_wheel,
                                runtime_requirements, wheel_cache, wheel_fits, wheel_metadata)
from scripts.llama_build import pinned_source  # noqa: E402
from scripts.llama_trim import check_trimmed, llama_tree, trim_llama  # noqa: E402

#: Largest pack (bytes): the checkout and the pack travel together within 64 MiB.
PACK_LIMIT_BYTES = 60 << 20
MANIFEST = "manifest.json"
LLAMA_TAR = "llama.cpp.tar.gz"
WHEELS = "wheels"
TOKENIZER = "tokenizer.gguf"


def tokenizer_gguf(source, out):
    """Write ``source``'s tokenizer (its ``tokenizer.*`` fields, chat template
    included) as a GGUF with no tensors. Returns the vocabulary size."""
    import gguf
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name("tokenizer of " + Path(source).name)
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            sub = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return len(reader.fields["tokenizer.ggml.tokens"].data)


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def folder_bytes(path):
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def git_commit():
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return head.stdout.strip(), bool(dirty.stdout.strip())


def make_pack(out, offline=False, source=None, tokenizer_source=None, cache=None):
    """Write the pack into ``out`` (replaced whole). Returns its manifest."""
    out = Path(out)
    cache = Path(cache or wheel_cache())
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / WHEELS).mkdir(parents=True)
    files, unpacked = trim_llama(llama_tree(source), tmp / LLAMA_TAR)
    pin, sdist_sha = pinned_source()
    wheels = []
    for name, requirement, parent in needed(runtime_requirements(), image_packages(), installed_requires):
        version = installed_version(name)
        if not requirement.specifier.contains(version, prereleases=True):
            raise SystemExit(f"{name} {version} installed here does not satisfy {requirement}")
        wheel = Path(shutil.copy2(fetch_wheel(cache, name, version, offline), tmp / WHEELS))
        wheels.append({"name": name, "version": version, "file": f"{WHEELS}/{wheel.name}", "sha256": sha256(wheel),
                       "needed_by": parent})
    project = project_wheel(tmp / WHEELS)
    if tokenizer_source is None:
        sys.path.insert(0, str(ROOT))  # this checkout's package, whatever the venv has installed
        from reticulum_grid.inference.default_model import default_model_path
        tokenizer_source = default_model_path()
    vocab = tokenizer_gguf(tokenizer_source, tmp / TOKENIZER)
    commit, dirty = git_commit()
    manifest = {
        "format": 1, "made": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit, "dirty": dirty, "python": f"{PYTHON[0]}.{PYTHON[1]}",
        "llama": {"file": LLAMA_TAR, "source": pin, "sdist_sha256": sdist_sha, "files": files,
                  "bytes": unpacked, "sha256": sha256(tmp / LLAMA_TAR)},
        "wheels": wheels,
        "project": {"file": f"{WHEELS}/{project.name}", "sha256": sha256(project)},
        "tokenizer": {"file": TOKENIZER, "from": Path(tokenizer_source).name, "vocab": vocab,
                      "sha256": sha256(tmp / TOKENIZER)},
        "image_packages": IMAGE_PACKAGES.relative_to(ROOT).as_posix(),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    manifest["total_bytes"] = folder_bytes(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return manifest


def check_pack(pack, pyproject=ROOT / "pyproject.toml", image_list=IMAGE_PACKAGES):
    """What is wrong with the pack at ``pack`` ([] when nothing): its size, every
    file against the manifest's SHA-256, a fitting wheel for every runtime
    dependency the image lacks and for theirs (read from the wheels' own
    metadata), one version of each, and the llama.cpp files the build needs."""
    pack = Path(pack)
    try:
        manifest = json.loads((pack / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        return [f"no readable {MANIFEST} in {pack}: {e}"]
    problems = []
    size = folder_bytes(pack)
    if size >= PACK_LIMIT_BYTES:
        problems.append(f"the pack is {size / 2**20:.1f} MiB, the limit {PACK_LIMIT_BYTES / 2**20:.0f} MiB")
    listed = [manifest["llama"], manifest["project"], manifest["tokenizer"], *manifest["wheels"]]
    for entry in listed:
        path = pack / entry["file"]
        if not path.is_file():
            problems.append(f"{entry['file']} is missing")
        elif sha256(path) != entry["sha256"]:
            problems.append(f"{entry['file']} does not match its SHA-256 in the manifest")
    on_disk = {p.name for p in (pack / WHEELS).glob("*.whl")}
    wheels = {}
    for name in sorted(on_disk):
        if not wheel_fits(name):
            problems.append(f"{WHEELS}/{name} does not install on CPython 3.12 manylinux x86-64")
            continue
        try:
            wname, version, requires = wheel_metadata(pack / WHEELS / name)
        except (OSError, KeyError, StopIteration, zipfile.BadZipFile) as e:
            problems.append(f"{WHEELS}/{name} is not a readable wheel: {e}")
            continue
        if wname in wheels:
            problems.append(f"two wheels of {wname}: {wheels[wname][0]} and {version}")
        wheels[wname] = (version, requires)
    for name, requirement, parent in needed(runtime_requirements(pyproject), image_packages(image_list),
                                            lambda n: wheels.get(n, (None, []))[1]):
        who = "a runtime dependency" if parent == "project" else f"needed by {parent}"
        if name not in wheels:
            problems.append(f"no wheel of {requirement} ({who}) and the image lacks it")
        elif not requirement.specifier.contains(wheels[name][0], prereleases=True):
            problems.append(f"the wheel of {name} is {wheels[name][0]}, {requirement} is needed ({who})")
    if not any(n.startswith("reticulum_grid-") for n in on_disk):
        problems.append("no wheel of the project itself")
    problems += check_trimmed(pack / manifest["llama"]["file"])
    return problems


def describe(manifest):
    """One line per part and the total, for the make target's output."""
    lines = [f"llama.cpp ({manifest['llama']['source']}): {manifest['llama']['files']} files, "
             f"{manifest['llama']['bytes'] / 2**20:.1f} MiB unpacked"]
    for w in manifest["wheels"]:
        why = "runtime dependency" if w["needed_by"] == "project" else f"for {w['needed_by']}"
        lines.append(f"wheel {w['name']} {w['version']} ({why})")
    lines.append(f"project wheel {Path(manifest['project']['file']).name}; "
                 f"tokenizer of {manifest['tokenizer']['from']} ({manifest['tokenizer']['vocab']} tokens)")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / ".gpu-pack"), help="the pack folder (replaced whole)")
    ap.add_argument("--offline", action="store_true", help="wheels from the cache only; no network")
    ap.add_argument("--source", default="", metavar="DIR", help="a llama.cpp tree (default: the pinned sdist's)")
    ap.add_argument("--tokenizer-from", default="", metavar="GGUF", help="default: the bundled model")
    ap.add_argument("--check", default="", metavar="DIR", help="check the pack at DIR; make nothing")
    opts = ap.parse_args(argv)
    if opts.check:
        problems = check_pack(opts.check)
        for problem in problems:
            print(f"gpu-pack: {problem}", file=sys.stderr)
        print(f"gpu_pack_ok={'yes' if not problems else 'no'} bytes={folder_bytes(opts.check)}")
        return 1 if problems else 0
    manifest = make_pack(opts.out, offline=opts.offline, source=opts.source or None,
                         tokenizer_source=opts.tokenizer_from or None)
    for line in describe(manifest):
        print(f"gpu-pack: {line}")
    problems = check_pack(opts.out)
    for problem in problems:
        print(f"gpu-pack: {problem}", file=sys.stderr)
    print(f"gpu-pack: {opts.out}: {manifest['total_bytes'] / 2**20:.1f} MiB "
          f"(limit {PACK_LIMIT_BYTES / 2**20:.0f} MiB)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
