"""Build llama.cpp's own server and RPC server for this machine's backend, and install torch.

Run by `make` with the system Python, before the project's virtual environment
has any packages, so it uses the standard library only.

The tower's engine is llama.cpp's ``llama-server`` (one child per loaded
model) and its ``ggml-rpc-server`` (the memory a tower lends to split
models), built once from the llama.cpp that the pinned llama-cpp-python
source distribution vendors (``[tool.rngrid.llama]`` in pyproject.toml: the
sdist and its SHA-256). One CMake build gives both binaries; no Python
binding of llama.cpp is installed. Which backend and which CMake flags this
machine gets is scripts/llama_flags.py's part.

Each set of flags is built once into ``~/.cache/rngrid/llama/<backend>-<key>/``
(key: BLAKE2 of the source pin and the flags; ``RNGRID_LLAMA_CACHE`` moves
it) and copied into the venv's ``bin/``. After installing, the binaries are
checked: ``llama-server --version`` runs and ``--list-devices`` shows a device
of the backend built for (CUDA0, MTL0, ...; a CPU build lists none). Beside
them goes ``llama-architectures.txt``: the model architectures that source
loads (its ``src/llama-arch.cpp`` table), read when a model from another tool
is imported (``rngrid models import``).

torch (``--torch SPEC``, installed first): ``--torch-index`` (make's TORCH_INDEX)
wins; otherwise a CPU tower on Linux adds PyTorch's CPU wheel index (its
``+cpu`` build outranks PyPI's CUDA build, several GB) when that index answers,
and CUDA and Metal towers take PyPI's build (CUDA on Linux, MPS on macOS).

Usage: python3 scripts/llama_build.py --venv .venv [--backend B] [--source DIR]
       [--torch torch==2.13.0] [--torch-index URL] [--dry-run]
"""

import argparse
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a file by make: scripts/ is importable from the checkout

from scripts.llama_flags import (choose_backend, cmake_args, cpu_args, cuda_architectures,  # noqa: E402
                                 cuda_library_args, find_nvcc, linux_cpu_flags, local_compute_caps,
                                 missing_toolkit_warning, nvidia_gpu_count)

#: The binaries the tower runs, built from one CMake tree.
BINARIES = ("llama-server", "ggml-rpc-server")
#: The device name prefix ``llama-server --list-devices`` shows for each backend's GPUs.
DEVICE_PREFIX = {"cuda": "CUDA", "metal": "MTL", "cpu": None}
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
#: The architectures this build loads, one a line, written beside the binaries (node/engine.py reads it).
ARCHITECTURES = "llama-architectures.txt"
#: Names in llama.cpp's LLM_ARCH_NAMES that no model file loads: "clip" is a dummy for llama-quantize
#: (its comment says so), "(unknown)" the lookup's fallback.
NOT_MODELS = ("clip", "(unknown)")


def pinned_source(pyproject=ROOT / "pyproject.toml"):
    """(sdist requirement "llama-cpp-python==V", its SHA-256) from pyproject.toml."""
    pin = tomllib.loads(Path(pyproject).read_text()).get("tool", {}).get("rngrid", {}).get("llama", {})
    if "source" not in pin or "sha256" not in pin:
        raise SystemExit("pyproject.toml lacks [tool.rngrid.llama] source and sha256")
    return pin["source"], pin["sha256"]


def plan(backend_override=""):
    """(backend, source pin, sha256, cmake args, build dir, nvcc, GPU count) for this machine."""
    nvcc, gpus = find_nvcc(), nvidia_gpu_count()
    backend = choose_backend(backend_override, platform.system(), platform.machine(), nvcc, gpus)
    source, sha = pinned_source()
    args = cmake_args(backend, cuda_architectures(local_compute_caps()) if backend == "cuda" else "native",
                      cpu_args(platform.system(), platform.machine(), linux_cpu_flags()))
    if backend == "cuda":
        args += cuda_library_args(nvcc, cuda_shim())[0]
    return backend, source, sha, args, build_dir(backend, source, args), nvcc, gpus


def llama_cache():
    """Where builds go: ``RNGRID_LLAMA_CACHE``, else ~/.cache/rngrid/llama."""
    return Path(os.environ.get("RNGRID_LLAMA_CACHE") or Path.home() / ".cache" / "rngrid" / "llama")


def build_dir(backend, source_pin, args, cache=None):
    """The folder one (source, flags) pair is built in."""
    cache = Path(cache or llama_cache())
    key = hashlib.blake2b(f"{source_pin} {' '.join(args)}".encode(), digest_size=6).hexdigest()
    return cache / f"{backend}-{key}"


def cuda_shim():
    """The folder of links to CUDA libraries found outside the toolkit (cuda_library_args)."""
    return llama_cache() / "cuda-libs"


def make_links(links):
    """Make the links cuda_library_args planned ({link: target}), replacing whatever is there."""
    for link, target in links.items():
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)


def fetch_source(pip, source, sha256, cache):
    """The vendored llama.cpp tree of the pinned sdist, downloaded once (pip
    download, checked against ``sha256``) and unpacked under ``cache``."""
    tree = cache / "src" / source.replace("==", "-") / "llama.cpp"
    if (tree / "CMakeLists.txt").exists():
        return tree
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([pip, "download", "--no-deps", "--no-binary", ":all:", "-d", tmp,
                        source], check=True)
        (sdist,) = Path(tmp).glob("*.tar.gz")
        digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
        if digest != sha256:
            raise SystemExit(f"{sdist.name} has SHA-256 {digest}, pyproject.toml pins {sha256}")
        with tarfile.open(sdist) as tar:
            top = tar.getnames()[0].split("/")[0]
            prefix = f"{top}/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            unpacked = Path(tmp) / "llama.cpp"
            tar.extractall(unpacked, members=members, filter="data")
        tree.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tree, ignore_errors=True)
        shutil.move(str(unpacked), tree)
    return tree


def build_commands(source_tree, house, args, nvcc=None, jobs=None):
    """The configure and build commands, as (argv, extra env) pairs."""
    env = {"CUDACXX": str(nvcc)} if nvcc else {}  # CMake finds nvcc even where it is not on PATH
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = (["cmake", "-S", str(source_tree), "-B", str(house / "build"), *generator, *args], env)
    build = (["cmake", "--build", str(house / "build"), "-j", str(jobs or os.cpu_count() or 2),
              "--target", *BINARIES], env)
    return configure, build


def install(house, bindir):
    """Copy the built binaries into ``bindir`` (the venv's bin/)."""
    bindir.mkdir(parents=True, exist_ok=True)
    for name in BINARIES:
        built = house / "bin" / name
        if not built.exists():
            raise SystemExit(f"{built} is missing: delete {house} and run make again")
        target = bindir / name
        tmp = target.with_name(name + ".tmp")
        shutil.copy2(built, tmp)
        os.replace(tmp, target)


def architectures(source_tree):
    """The model architectures the llama.cpp at ``source_tree`` loads: the
    names in src/llama-arch.cpp's LLM_ARCH_NAMES table ("llama", "qwen2", ...),
    but NOT_MODELS. Raises SystemExit when the table is not there."""
    text = (Path(source_tree) / "src" / "llama-arch.cpp").read_text()
    start = text.find("LLM_ARCH_NAMES = {")
    if start < 0:
        raise SystemExit(f"{source_tree}/src/llama-arch.cpp has no LLM_ARCH_NAMES table")
    table = text[start:text.index("};", start)]
    names = re.findall(r'\{\s*LLM_ARCH_\w+\s*,\s*"([^"]+)"\s*\}', table)
    return sorted(set(names) - set(NOT_MODELS))


def write_architectures(source_tree, bindir):
    """Write architectures(source_tree) into ``bindir``/ARCHITECTURES, one a line."""
    target = Path(bindir) / ARCHITECTURES
    tmp = target.with_name(ARCHITECTURES + ".tmp")
    tmp.write_text("".join(f"{name}\n" for name in architectures(source_tree)))
    os.replace(tmp, target)


def collect(house):
    """Keep the binaries beside the build tree (bin/), once the build finished."""
    (house / "bin").mkdir(parents=True, exist_ok=True)
    for name in BINARIES:
        shutil.copy2(house / "build" / "bin" / name, house / "bin" / name)


def check(bindir, backend):
    """Run the installed binaries once: ``--version``, and ``--list-devices``
    must show the backend's device. Returns the version line. Raises SystemExit."""
    server = bindir / "llama-server"
    try:
        version = subprocess.run([server, "--version"], capture_output=True, text=True, timeout=60)
        devices = subprocess.run([server, "--list-devices"], capture_output=True, text=True, timeout=120)
        rpc = subprocess.run([bindir / "ggml-rpc-server", "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise SystemExit(f"the installed llama.cpp does not run: {e}") from None
    text = version.stdout + version.stderr
    if "version" not in text:
        raise SystemExit(f"{server} --version printed no version:\n{text}")
    prefix = DEVICE_PREFIX[backend]
    listed = devices.stdout + devices.stderr
    if prefix and f"  {prefix}" not in listed:
        raise SystemExit(f"the {backend} build lists no {prefix} device:\n{listed}")
    if "--port" not in rpc.stdout + rpc.stderr:
        raise SystemExit("ggml-rpc-server --help shows no --port option")
    return next(line for line in text.splitlines() if "version" in line).strip()


def torch_command(pip, spec, backend, system, index="", cpu_index_reachable=None):
    """pip argv installing torch ``spec`` for ``backend`` (see the module doc).
    ``cpu_index_reachable``: a callable asked only when the CPU index matters."""
    if index:
        return [pip, "install", spec, "--index-url", index]
    if backend == "cpu" and system == "Linux" and (cpu_index_reachable or _reachable)(CPU_TORCH_INDEX):
        return [pip, "install", spec, "--extra-index-url", CPU_TORCH_INDEX]
    return [pip, "install", spec]


def _reachable(url, timeout_s=5.0):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s):
            return True
    except Exception:
        return False


def _torch_cuda(python):
    """torch's CUDA version in the venv ("" for a CPU build)."""
    code = "import torch; print(torch.version.cuda or '')"
    return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.strip()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", required=True, help="the virtual environment to install into")
    ap.add_argument("--backend", default=os.environ.get("LLAMA_BACKEND", ""))
    ap.add_argument("--source", default="", metavar="DIR", help="a llama.cpp source tree (default: the pinned sdist's)")
    ap.add_argument("--jobs", type=int, default=0, help="parallel compile jobs (default: all cores)")
    ap.add_argument("--torch", default="", metavar="SPEC", help="also install torch first, e.g. torch==2.13.0")
    ap.add_argument("--torch-index", default="", metavar="URL", help="pip index for torch (overrides the choice)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and commands; run nothing")
    opts = ap.parse_args(argv)
    venv = Path(opts.venv)
    pip, bindir = str(venv / "bin" / "pip"), venv / "bin"
    backend, source, sha, args, house, nvcc, gpus = plan(opts.backend)
    if opts.source:
        house = build_dir(backend, f"{source} {Path(opts.source).resolve()}", args)
    tree = Path(opts.source) if opts.source else house.parent / "src" / source.replace("==", "-") / "llama.cpp"
    configure, build = build_commands(tree, house, args, nvcc if backend == "cuda" else None, opts.jobs)
    torch = torch_command(pip, opts.torch, backend, platform.system(), opts.torch_index) if opts.torch else None
    built = all((house / "bin" / name).exists() for name in BINARIES)
    print(f"llama.cpp backend: {backend}; {' '.join(args)}; build {house}" + (" (built)" if built else ""),
          flush=True)
    if warning := missing_toolkit_warning(backend, opts.backend, nvcc, gpus):
        print(warning, file=sys.stderr, flush=True)
    links, missing = cuda_library_args(nvcc, cuda_shim())[1:] if backend == "cuda" else ({}, [])
    if missing:
        print(f"warning: the CUDA toolkit of {nvcc} has no {', '.join(missing)}, and no NVIDIA wheel on this "
              "Python's path has it either: install cuBLAS (the toolkit's, or pip install nvidia-cublas); "
              "CMake will stop without it", file=sys.stderr, flush=True)
    for link, target in links.items():
        print(f"{'would link' if opts.dry_run else 'linking'} {link} -> {target}", file=sys.stderr, flush=True)
    if opts.dry_run:
        for argv_, env in ([(torch, {})] if torch else []) + ([] if built else [configure, build]):
            print(" ".join([*(f"{k}={v!r}" for k, v in env.items()), *map(str, argv_)]))
        return 0
    if torch:
        subprocess.run(torch, check=True)
    if not built:
        make_links(links)
        if not opts.source:
            fetch_source(pip, source, sha, house.parent)
        print("building llama.cpp's server and RPC server (several minutes; once per set of flags)", flush=True)
        for argv_, env in (configure, build):
            subprocess.run(argv_, env={**os.environ, **env}, check=True)
        collect(house)
    install(house, bindir)
    if (tree / "src" / "llama-arch.cpp").exists():
        write_architectures(tree, bindir)
    else:  # a build kept from a source tree deleted since: `rngrid models import` then cannot judge
        print(f"warning: {tree} is gone, so {bindir / ARCHITECTURES} (the architectures this build loads) is not "
              "written; delete the build folder and run make again", file=sys.stderr, flush=True)
    print(f"installed {', '.join(BINARIES)} into {bindir}: {check(bindir, backend)}", flush=True)
    if torch and backend == "cuda" and not _torch_cuda(str(bindir / "python")):
        print("warning: the torch installed is a CPU build, so training runs on the CPU; "
              "pass TORCH_INDEX=https://download.pytorch.org/whl/cu128 (your CUDA version) to make",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
