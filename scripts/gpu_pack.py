"""The GPU pack: what a lent GPU machine with no network lacks, in one folder.

That machine (CPython 3.12 on x86-64 Linux with PyTorch, transformers, peft,
the CUDA toolkit, CMake and ninja: scripts/gpu_image_packages.txt lists its
Python packages) reaches no package index and no model hub, and everything it
gets travels with the checkout, 64 MiB in all. ``make gpu-pack`` writes
``.gpu-pack/`` (ignored by git), kept under ``PACK_LIMIT_BYTES``:

- ``llama.cpp.tar.gz``: the llama.cpp tree that the pinned llama-cpp-python
  sdist vendors (``[tool.rngrid.llama]``), trimmed to what CMake needs to
  build ``llama-server`` and ``ggml-rpc-server`` with the CPU, CUDA and RPC
  backends: no web UI sources, tests, docs, vocabularies, models or other
  backends (``keep_llama``);
- ``wheels/``: a wheel of every runtime dependency of this project missing
  from that image, and of their dependencies in turn (``needed``), for
  CPython 3.12 manylinux x86-64, at the versions installed here; and a wheel
  of the project itself;
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
import email.parser
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parent.parent
#: Largest pack (bytes): the checkout and the pack travel together within 64 MiB.
PACK_LIMIT_BYTES = 60 << 20
IMAGE_PACKAGES = ROOT / "scripts" / "gpu_image_packages.txt"
MANIFEST = "manifest.json"
LLAMA_TAR = "llama.cpp.tar.gz"
WHEELS = "wheels"
TOKENIZER = "tokenizer.gguf"
#: The GPU machine's interpreter and platform.
PYTHON = (3, 12)
#: glibc 2.17 to 2.39, the oldest first: pip prefers the platforms named first, and a wheel
#: for an older glibc runs on more machines.
GLIBC_MINORS = range(17, 40)
PLATFORMS = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"] + [
    f"manylinux_2_{n}_x86_64" for n in GLIBC_MINORS]
#: Marker values of that interpreter (requirements are evaluated for it, not for this one).
MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
           "platform_machine": "x86_64", "os_name": "posix", "extra": ""}

# -- what the llama.cpp build needs --------------------------------------------

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
    """The llama.cpp tree to trim: ``source``, else the pinned sdist's (fetched once by llama_build)."""
    if source:
        return Path(source)
    build = _llama_build()
    pin, sha = build.pinned_source()
    cache = Path(os.environ.get("RNGRID_LLAMA_CACHE") or Path.home() / ".cache" / "rngrid" / "llama")
    pip = str(Path(sys.executable).parent / "pip")
    return build.fetch_source(pip, pin, sha, cache)


def _llama_build():
    spec = importlib.util.spec_from_file_location("llama_build", ROOT / "scripts" / "llama_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


# -- which wheels ----------------------------------------------------------------

def image_packages(path=IMAGE_PACKAGES):
    """The canonical names of the Python packages the GPU machine's image holds."""
    names = set()
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(canonicalize_name(line))
    return names


def runtime_requirements(pyproject=ROOT / "pyproject.toml"):
    """[Requirement] of the project's runtime dependencies (pyproject's ``dependencies``)."""
    return [Requirement(r) for r in tomllib.loads(Path(pyproject).read_text())["project"]["dependencies"]]


def applies(requirement):
    """True when ``requirement`` holds on the GPU machine's interpreter (no extras)."""
    return requirement.marker is None or requirement.marker.evaluate(MARKERS)


def needed(requirements, image, requires_of):
    """[(name, requirement, needed_by)] that the GPU machine lacks: ``requirements``
    whose names are not in ``image``, then (``requires_of(name)`` -> [Requirement])
    theirs, depth first, each name once. ``needed_by`` is "project" or the
    dependent's name."""
    out, seen = [], set()
    stack = [(r, "project") for r in reversed(requirements)]
    while stack:
        requirement, parent = stack.pop()
        name = canonicalize_name(requirement.name)
        if not applies(requirement) or name in image or name in seen:
            continue
        seen.add(name)
        out.append((name, requirement, parent))
        stack.extend((r, name) for r in reversed(requires_of(name)))
    return out


def installed_requires(name):
    """The requirements of the distribution ``name`` installed here."""
    import importlib.metadata as md
    return [Requirement(r) for r in md.distribution(name).requires or ()]


def installed_version(name):
    import importlib.metadata as md
    try:
        return md.distribution(name).version
    except md.PackageNotFoundError:
        raise SystemExit(f"{name} is not installed in {sys.prefix}: run make setup, then make gpu-pack") from None


def target_tags():
    """The wheel tags the GPU machine's pip accepts."""
    tags = list(cpython_tags(PYTHON, abis=[f"cp{PYTHON[0]}{PYTHON[1]}", "abi3", "none"], platforms=PLATFORMS))
    tags += list(compatible_tags(PYTHON, f"cp{PYTHON[0]}{PYTHON[1]}", PLATFORMS))
    return set(tags)


def wheel_fits(filename, tags=None):
    """True when the wheel ``filename`` installs on the GPU machine."""
    try:
        _, _, _, wheel_tags = parse_wheel_filename(filename)
    except ValueError:
        return False
    return bool(set(wheel_tags) & (tags or target_tags()))


def wheel_metadata(path):
    """(canonical name, version, [Requirement]) from a wheel's METADATA."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        msg = email.parser.Parser().parsestr(z.read(meta).decode("utf-8"))
    return canonicalize_name(msg["Name"]), msg["Version"], [Requirement(r) for r in msg.get_all("Requires-Dist") or ()]


def wheel_cache():
    return Path(os.environ.get("RNGRID_WHEEL_CACHE") or Path.home() / ".cache" / "rngrid" / "gpu-wheels")


def cached_wheel(cache, name, version):
    """A wheel of ``name`` ``version`` in ``cache`` that fits the GPU machine, or None."""
    tags = target_tags()
    for path in sorted(Path(cache).glob("*.whl")) if Path(cache).is_dir() else ():
        try:
            wname, wversion, _, _ = parse_wheel_filename(path.name)
        except ValueError:
            continue
        if wname == name and str(wversion) == version and wheel_fits(path.name, tags):
            return path
    return None


def fetch_wheel(cache, name, version, offline):
    """The wheel of ``name`` ``version`` for the GPU machine: from ``cache``, or
    downloaded into it by pip (never with ``offline``)."""
    found = cached_wheel(cache, name, version)
    if found or offline:
        if not found:
            raise SystemExit(f"no wheel of {name}=={version} for CPython 3.12 manylinux x86-64 in {cache}: "
                             "run make gpu-pack once with a network")
        return found
    Path(cache).mkdir(parents=True, exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--python-version", f"{PYTHON[0]}.{PYTHON[1]}", "--implementation", "cp", *platforms,
                    "-d", str(cache), f"{name}=={version}"], check=True)
    found = cached_wheel(cache, name, version)
    if not found:
        raise SystemExit(f"pip downloaded no wheel of {name}=={version} that fits CPython 3.12 manylinux x86-64")
    return found


def project_wheel(out_dir):
    """A wheel of this project, built from the files git tracks (as they are in the checkout)."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory(prefix="rngrid-pack-") as tmp:
        copy = Path(tmp) / "src"
        for rel in filter(None, tracked.decode().split("\0")):
            if (ROOT / rel).is_file():
                (copy / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, copy / rel)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "-w", str(Path(tmp) / "dist"), str(copy)], check=True,
                       stdout=subprocess.DEVNULL)
        (wheel,) = (Path(tmp) / "dist").glob("*.whl")
        return Path(shutil.copy2(wheel, Path(out_dir) / wheel.name))


# -- the tokenizer ---------------------------------------------------------------

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


# -- making and checking a pack ----------------------------------------------------

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
    pin, sdist_sha = _llama_build().pinned_source()
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
    problems += _check_llama(pack / manifest["llama"]["file"])
    return problems


def _check_llama(tar_path):
    try:
        with tarfile.open(tar_path) as tar:
            names = {n.removeprefix("llama.cpp/") for n in tar.getnames()}
    except (OSError, tarfile.TarError) as e:
        return [f"{tar_path.name} is not a readable tar.gz: {e}"]
    problems = [f"{tar_path.name} lacks {rel}" for rel in LLAMA_REQUIRED if rel not in names]
    problems += [f"{tar_path.name} holds {prefix} (trimmed trees leave it out)" for prefix in LLAMA_ABSENT
                 if any(n.startswith(prefix) for n in names)]
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
