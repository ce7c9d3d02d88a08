"""Install torch and llama-cpp-python built for this machine's backend.

Run by `make` with the system Python, before the project's virtual environment
has any packages, so it uses the standard library only.

Backend choice (`choose_backend`): `LLAMA_BACKEND` (cuda|metal|cpu) wins;
otherwise Metal on macOS arm64, CUDA where `nvcc` is found *and* an NVIDIA GPU
is visible (`nvidia-smi -L`), CPU otherwise (with a warning and the fixing
command when a GPU is there but the toolkit is not). RPC (`-DGGML_RPC=on`) is
on for every backend: split inference needs it on every tower.

A CUDA build targets only the local GPUs' architectures (`nvidia-smi
--query-gpu=compute_cap`: 8.6 -> 86), so it takes minutes, not the hour a
build for every architecture takes; CMake's `native` is the fallback where
the driver cannot say. The architecture is part of the build flags, so a
wheel built for one GPU is never installed for another.

pip reuses a cached llama-cpp-python wheel whatever `CMAKE_ARGS` say, so each
set of flags is built once with `--no-cache-dir` into its own wheelhouse,
`~/.cache/rngrid/wheels/<backend>-<key>/` (key: BLAKE2 of version + flags), and
installed from there. After installing, the shared libraries the backend needs
(`libggml-rpc.so`, `libggml-cuda.so`, ...) are checked; a missing one is an error.

torch (`--torch SPEC`, installed first): `--torch-index` (make's TORCH_INDEX)
wins; otherwise a CPU tower on Linux adds PyTorch's CPU wheel index (its
`+cpu` build outranks PyPI's CUDA build, several GB) when that index answers,
and CUDA and Metal towers take PyPI's build (CUDA on Linux, MPS on macOS).

Usage: python3 scripts/llama_wheel.py --pip .venv/bin/pip [--backend B]
       [--torch torch==2.13.0] [--torch-index URL] [--dry-run]
"""

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("cuda", "metal", "cpu")
# Libraries llama-cpp-python's wheel carries in llama_cpp/lib for each backend.
REQUIRED_LIBS = {"cpu": ["ggml-rpc"], "metal": ["ggml-rpc", "ggml-metal"], "cuda": ["ggml-rpc", "ggml-cuda"]}
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
DEFAULT_NVCC = Path("/usr/local/cuda/bin/nvcc")


def pinned_version(pyproject=ROOT / "pyproject.toml"):
    """The llama-cpp-python version pinned in pyproject.toml (one place for it)."""
    deps = tomllib.loads(Path(pyproject).read_text())["project"]["dependencies"]
    for dep in deps:
        name, _, version = dep.partition("==")
        if name.strip() == "llama-cpp-python":
            return version.strip()
    raise SystemExit("pyproject.toml does not pin llama-cpp-python==VERSION")


def choose_backend(override, system, machine, nvcc, nvidia_gpus):
    """The llama.cpp backend for a machine.

    override: "" or one of BACKENDS (ValueError otherwise); system/machine as
    platform.system()/machine(); nvcc: path or None; nvidia_gpus: GPUs listed by
    nvidia-smi (int). A toolkit without a GPU gives a CPU build: `native`
    needs a GPU to detect, and a build for every architecture takes an hour."""
    if override:
        if override not in BACKENDS:
            raise ValueError(f"LLAMA_BACKEND must be one of {', '.join(BACKENDS)}, not {override!r}")
        return override
    if system == "Darwin" and machine == "arm64":
        return "metal"
    if nvcc and nvidia_gpus > 0:
        return "cuda"
    return "cpu"


def missing_toolkit_warning(backend, override, nvcc, nvidia_gpus):
    """The warning for a CPU build on a machine whose NVIDIA GPU it leaves idle, else None."""
    if backend != "cpu" or override or nvcc or nvidia_gpus == 0:
        return None
    return (f"warning: {nvidia_gpus} NVIDIA GPU(s) found but no CUDA toolkit (nvcc), so llama.cpp is built for the "
            "CPU and towers here will not use the GPU. Install the CUDA toolkit (nvcc on PATH or "
            f"{DEFAULT_NVCC}), then run `make llama LLAMA_BACKEND=cuda`.")


def cuda_architectures(compute_caps):
    """CMAKE_CUDA_ARCHITECTURES for GPUs of these compute capabilities
    ("8.6", "9.0", ...): "86", "86;90", or "native" when none is known."""
    archs = sorted({cap.strip().replace(".", "") for cap in compute_caps
                    if cap.strip().replace(".", "").isdigit()}, key=int)
    return ";".join(archs) or "native"


def cmake_args(backend, cuda_arch="native"):
    """CMAKE_ARGS for llama-cpp-python's build of ``backend``."""
    args = ["-DGGML_RPC=on"]
    if backend == "cuda":
        args += ["-DGGML_CUDA=on", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}"]
    elif backend == "metal":
        args += ["-DGGML_METAL=on"]
    return args


def wheelhouse(backend, version, args, cache=None):
    """The wheelhouse folder for one (version, flags) pair."""
    cache = Path(cache or os.environ.get("RNGRID_WHEELS") or Path.home() / ".cache" / "rngrid" / "wheels")
    key = hashlib.blake2b(f"{version} {' '.join(args)}".encode(), digest_size=6).hexdigest()
    return cache / f"{backend}-{key}"


def _nvidia_smi(*args):
    """nvidia-smi's output lines, [] without the tool or a driver."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, *args], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def nvidia_gpu_count():
    """GPUs that nvidia-smi lists (0 without the tool or a driver)."""
    return sum(1 for line in _nvidia_smi("-L") if line.startswith("GPU "))


def local_compute_caps():
    """Compute capabilities of the local NVIDIA GPUs ("9.0", ...)."""
    return _nvidia_smi("--query-gpu=compute_cap", "--format=csv,noheader")


def find_nvcc():
    return shutil.which("nvcc") or (str(DEFAULT_NVCC) if DEFAULT_NVCC.exists() else None)


def plan(backend_override=""):
    """(backend, version, cmake args, wheelhouse, nvcc, GPU count) for this machine."""
    nvcc, gpus = find_nvcc(), nvidia_gpu_count()
    backend = choose_backend(backend_override, platform.system(), platform.machine(), nvcc, gpus)
    version = pinned_version()
    args = cmake_args(backend, cuda_architectures(local_compute_caps()) if backend == "cuda" else "native")
    return backend, version, args, wheelhouse(backend, version, args), nvcc, gpus


def commands(pip, backend, version, args, house, nvcc=None):
    """The build (if needed) and install commands, as (argv, extra env) pairs."""
    env = {"CMAKE_ARGS": " ".join(args), "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    if backend == "cuda" and nvcc:
        env["CUDACXX"] = str(nvcc)  # CMake finds nvcc even where it is not on PATH
    build = ([pip, "wheel", "--no-deps", "--no-cache-dir", "--no-binary", "llama-cpp-python",
              "-w", str(house), f"llama-cpp-python=={version}"], env)
    install = ([pip, "install", "--no-deps", "--force-reinstall", "--no-index", "--find-links", str(house),
                f"llama-cpp-python=={version}"], {})
    return build, install


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


def installed_libs(python):
    """Names of the shared libraries in the installed llama_cpp/lib folder."""
    code = "import importlib.util,os;s=importlib.util.find_spec('llama_cpp');print(os.path.join(os.path.dirname(s.origin),'lib'))"
    libdir = Path(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip())
    return {p.name for p in libdir.iterdir()} if libdir.is_dir() else set()


def missing_libs(backend, names):
    """Libraries ``backend`` needs that are not among ``names``."""
    return [lib for lib in REQUIRED_LIBS[backend]
            if not any(n.startswith(f"lib{lib}.") or n.startswith(f"{lib}.") for n in names)]


def _torch_cuda(python):
    """torch's CUDA version in the venv ("" for a CPU build)."""
    code = "import torch; print(torch.version.cuda or '')"
    return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.strip()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pip", required=True, help="the venv's pip")
    ap.add_argument("--backend", default=os.environ.get("LLAMA_BACKEND", ""))
    ap.add_argument("--torch", default="", metavar="SPEC", help="also install torch first, e.g. torch==2.13.0")
    ap.add_argument("--torch-index", default="", metavar="URL", help="pip index for torch (overrides the choice)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and commands; run nothing")
    opts = ap.parse_args(argv)
    backend, version, args, house, nvcc, gpus = plan(opts.backend)
    build, install = commands(opts.pip, backend, version, args, house, nvcc)
    torch = torch_command(opts.pip, opts.torch, backend, platform.system(), opts.torch_index) if opts.torch else None
    print(f"llama.cpp backend: {backend} (CMAKE_ARGS={' '.join(args)}); wheelhouse {house}", flush=True)
    if warning := missing_toolkit_warning(backend, opts.backend, nvcc, gpus):
        print(warning, file=sys.stderr, flush=True)
    have_wheel = house.is_dir() and any(house.glob("llama_cpp_python-*.whl"))
    steps = ([(torch, {})] if torch else []) + ([] if have_wheel else [build]) + [install]
    if opts.dry_run:
        for argv_, env in steps:
            print(" ".join([*(f"{k}={v!r}" for k, v in env.items()), *argv_]))
        return 0
    for argv_, env in steps:
        if argv_ is build[0]:
            print("building llama.cpp (several minutes; once per set of flags)", flush=True)
            house.mkdir(parents=True, exist_ok=True)
        subprocess.run(argv_, env={**os.environ, **env}, check=True)
    python = str(Path(opts.pip).with_name("python"))
    missing = missing_libs(backend, installed_libs(python))
    if missing:
        raise SystemExit(f"llama-cpp-python lacks {', '.join(missing)} for backend {backend}: "
                         f"delete {house} and run make again")
    if torch and backend == "cuda" and not _torch_cuda(python):
        print("warning: the torch installed is a CPU build, so training runs on the CPU; "
              "pass TORCH_INDEX=https://download.pytorch.org/whl/cu128 (your CUDA version) to make",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
