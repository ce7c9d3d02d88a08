"""What llama.cpp build this machine gets: the backend and the CMake flags.

Standard library only: scripts/llama_build.py, which asks it, runs before the venv has any packages.

Backend choice (``choose_backend``): ``LLAMA_BACKEND`` (cuda|metal|cpu) wins;
otherwise Metal on macOS arm64, CUDA where ``nvcc`` is found *and* an NVIDIA
GPU is visible (``nvidia-smi -L``), CPU otherwise (with a warning and the
fixing command when a GPU is there but the toolkit is not). RPC
(``-DGGML_RPC=ON``) is on for every backend: split inference needs it on
every tower. A CUDA build targets only the local GPUs' architectures
(``nvidia-smi --query-gpu=compute_cap``: 8.6 -> 86), so it takes minutes, not
the hour a build for every architecture takes; CMake's ``native`` is the
fallback where the driver cannot say. An x86-64 Linux build names the CPU's
ISA extensions instead of -march=native (``cpu_args``), and a CUDA toolkit
assembled from NVIDIA's pip wheels gets the libraries it lacks through links
(``cuda_library_args``).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

BACKENDS = ("cuda", "metal", "cpu")
DEFAULT_NVCC = Path("/usr/local/cuda/bin/nvcc")
#: Nothing in the build reaches a network: no prebuilt web UI download, no HTTPS client.
COMMON_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_RPC=ON",
                "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
                "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF")


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


#: /proc/cpuinfo flags -> ggml's x86 ISA options (ggml/CMakeLists.txt), for a build without -march=native.
X86_FLAGS = {"sse4_2": "GGML_SSE42", "avx": "GGML_AVX", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C",
             "bmi2": "GGML_BMI2", "avx_vnni": "GGML_AVX_VNNI", "avx512vbmi": "GGML_AVX512_VBMI",
             "avx512_vnni": "GGML_AVX512_VNNI", "avx512_bf16": "GGML_AVX512_BF16"}
AVX512 = ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")


def cpu_args(system, machine, cpu_flags):
    """ggml's CPU flags for this machine. On x86-64 Linux: every ISA extension
    the CPU reports except AMX, instead of -march=native. A VM may advertise
    AMX without enabling it: llama-server then dies of SIGILL at its first
    matrix product (seen: tilezero in tinygemm_kernel_amx, on a Xeon guest
    whose /proc/cpuinfo lists amx_tile). Elsewhere: -march=native."""
    if system != "Linux" or machine not in ("x86_64", "AMD64"):
        return []
    flags = set(cpu_flags)
    args = ["-DGGML_NATIVE=OFF"] + [f"-D{opt}=ON" for flag, opt in X86_FLAGS.items() if flag in flags]
    if all(f in flags for f in AVX512):
        args.append("-DGGML_AVX512=ON")
    return sorted(args)


def linux_cpu_flags(path="/proc/cpuinfo"):
    """The first CPU's flags in /proc/cpuinfo ([] where there is none)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return line.split(":", 1)[1].split()
    except OSError:
        pass
    return []


def cmake_args(backend, cuda_arch="native", cpu=()):
    """The CMake flags of llama.cpp's build for ``backend``; ``cpu``: cpu_args()."""
    args = list(COMMON_FLAGS) + list(cpu)
    if backend == "cuda":
        args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}"]
    elif backend == "metal":
        args += ["-DGGML_METAL=ON"]
    return args


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


#: CUDA libraries ggml-cuda links ({CMake's CUDA_<name>_LIBRARY name: file name}).
CUDA_LIBRARIES = {"cublas": "libcublas.so", "cublasLt": "libcublasLt.so", "cuda_driver": "libcuda.so"}
#: Where the NVIDIA driver's own libcuda may sit (a container's mounted driver folder first).
DRIVER_DIRS = ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64",
               "/usr/lib/wsl/lib")


def toolkit_roots(nvcc):
    """Folders that may be the CUDA toolkit ``nvcc`` belongs to."""
    roots = [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    if nvcc:
        roots.append(Path(nvcc).resolve().parent.parent)
    return roots + [Path("/usr/local/cuda")]


def _in_toolkit(roots, filename):
    return any((root / lib / filename).exists() for root in roots
               for lib in ("lib64", "lib", "targets/x86_64-linux/lib", "lib64/stubs", "lib/stubs"))


def _wheel_library(filename, search_path):
    """``filename``'s versioned file (libcublas.so.13) in NVIDIA's pip wheels
    (``nvidia/cu13/lib``, ``nvidia/cublas/lib``) on ``search_path``, or None."""
    for entry in search_path:
        for lib in sorted(Path(entry).glob("nvidia/*/lib")) if Path(entry).is_dir() else ():
            found = sorted(lib.glob(filename + ".*"))
            if found:
                return found[0]
    return None


def cuda_library_args(nvcc, shim, search_path=None, driver_dirs=DRIVER_DIRS):
    """(CMake flags, {link: target}, [files found nowhere]) for CUDA libraries the toolkit lacks. A
    toolkit assembled from NVIDIA's pip wheels (nvcc, the runtime) may have no
    cuBLAS and no driver stub: cuBLAS then comes from the nvidia-cublas wheel
    that PyTorch installed (on ``search_path``, default sys.path), libcuda from
    the driver itself, each through links in ``shim`` (unversioned for the
    linker, the versioned name for the loader; the build's RPATH names it).
    Without a libcuda anywhere, ggml's virtual-memory pool is left out
    (GGML_CUDA_NO_VMM). Nothing is written here: make the links before building."""
    roots = toolkit_roots(nvcc)
    search_path = sys.path if search_path is None else search_path
    args, links, missing = [], {}, []
    for name, filename in CUDA_LIBRARIES.items():
        if _in_toolkit(roots, filename):
            continue
        if name == "cuda_driver":
            found = next((Path(d) / f for d in driver_dirs for f in (filename, filename + ".1")
                          if (Path(d) / f).exists()), None)
        else:
            found = _wheel_library(filename, search_path)
        if found is None:
            if name == "cuda_driver":
                args.append("-DGGML_CUDA_NO_VMM=ON")
                continue
            missing.append(filename)
            continue
        links[Path(shim) / "lib" / filename] = found
        links[Path(shim) / "lib" / found.name] = found
        if name == "cuda_driver":
            links[Path(shim) / "lib" / (filename + ".1")] = found  # its SONAME, for the loader
        args.append(f"-DCUDA_{name}_LIBRARY={Path(shim) / 'lib' / filename}")
        include = found.parent.parent / "include"
        if name == "cublas" and (include / "cublas_v2.h").exists():
            args.append(f"-DCMAKE_CUDA_FLAGS=-isystem {include}")
            args.append(f"-DCMAKE_CXX_FLAGS=-isystem {include}")
    if links:
        args.append(f"-DCMAKE_BUILD_RPATH={Path(shim) / 'lib'}")
    return args, links, missing

