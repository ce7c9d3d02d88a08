"""The llama.cpp build this tower runs: where its binaries are and what devices it sees.

``make`` builds llama.cpp's ``llama-server`` and ``ggml-rpc-server`` once per
backend (scripts/llama_build.py) and copies them into the venv's ``bin/``.
They are found there (beside this Python), then on ``PATH``;
``RNGRID_LLAMA_BIN`` (a folder) overrides both.

``devices()`` asks the build itself (``llama-server --list-devices``: the
devices llama.cpp would use, in its own order, the order ``--tensor-split``
follows; CUDA_VISIBLE_DEVICES honoured), so a tower never claims a GPU its
engine cannot use. The tower process itself never loads a GPU driver: every
model runs in a child.
"""

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

SERVER = "llama-server"
RPC_SERVER = "ggml-rpc-server"
#: llama.cpp device name prefixes -> the backend names caps use (announce.caps.BACKENDS).
DEVICE_BACKENDS = {"CUDA": "cuda", "MTL": "metal", "ROCm": "rocm", "Vulkan": "vulkan", "SYCL": "sycl"}
#: "  CUDA0: NVIDIA H200 (143771 MiB, 143000 MiB free)", as common_print_available_devices prints it.
_DEVICE_LINE = re.compile(r"^\s+(\S+?): (.*) \((\d+) MiB, (\d+) MiB free\)\s*$")


class EngineMissing(RuntimeError):
    """llama.cpp's binaries are not installed; the message says how to build them."""


@dataclass(frozen=True)
class Device:
    """A device llama.cpp lists: ``name`` ("CUDA0"), its ``backend`` (cuda,
    metal, ...; "rpc" for a remote one), description and memory (MiB)."""
    name: str
    backend: str
    description: str
    total_mib: int
    free_mib: int


def binary(name: str) -> str:
    """Absolute path of llama.cpp binary ``name``. Raises EngineMissing."""
    folder = os.environ.get("RNGRID_LLAMA_BIN")
    candidates = [Path(folder) / name] if folder else [Path(sys.executable).parent / name]
    if not folder and (found := shutil.which(name)):
        candidates.append(Path(found))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    raise EngineMissing(f"llama.cpp's {name} is not installed (looked in {', '.join(map(str, candidates))}); "
                        "run `make llama` in the reticulum_grid checkout")


def available(name: str = SERVER) -> bool:
    """True when binary ``name`` is installed."""
    try:
        binary(name)
        return True
    except EngineMissing:
        return False


def child_env() -> dict[str, str]:
    """The environment llama.cpp's processes run in: ours without llama.cpp's
    own LLAMA_ARG_* settings (the tower passes every flag itself), GPUs
    numbered in PCI bus order as nvidia-smi numbers them, and no backtrace on
    an abort (ggml would attach gdb to itself, which holds a dying process
    for seconds)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    env.setdefault("GGML_NO_BACKTRACE", "1")
    return env


def parse_devices(text: str) -> list[Device]:
    """Devices from ``llama-server --list-devices`` output (CPU is never listed)."""
    out = []
    for line in text.splitlines():
        m = _DEVICE_LINE.match(line)
        if not m:
            continue
        name, description, total, free = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
        prefix = re.sub(r"\d+$", "", name)
        backend = "rpc" if name.startswith("RPC") else DEVICE_BACKENDS.get(prefix, prefix.lower())
        out.append(Device(name, backend, description, total, min(free, total)))
    return out


def list_devices(timeout_s: float = 60.0) -> list[Device]:
    """The devices this llama.cpp build sees now ([] without a GPU build or a
    GPU). Starts a short-lived process (it loads the GPU driver: ~0.1-1 s)."""
    try:
        done = subprocess.run([binary(SERVER), "--list-devices"], capture_output=True, text=True, timeout=timeout_s,
                              env=child_env())
    except (EngineMissing, OSError, subprocess.SubprocessError):
        return []
    return parse_devices(done.stdout)


@lru_cache(maxsize=1)
def build_info() -> str:
    """llama-server's version line ("version: 1 (0c1e570)"), or "" when missing."""
    try:
        done = subprocess.run([binary(SERVER), "--version"], capture_output=True, text=True, timeout=60)
    except (EngineMissing, OSError, subprocess.SubprocessError):
        return ""
    return next((line.strip() for line in (done.stdout + done.stderr).splitlines() if "version" in line), "")


#: Written beside the binaries by the build (scripts/llama_build.py): one architecture a line.
ARCHITECTURES = "llama-architectures.txt"


def architectures() -> frozenset[str] | None:
    """The model architectures ("llama", "qwen2", ...) this llama.cpp build
    loads, or None when it cannot say (no build, or one made before the list
    was written: `make llama` writes it). The list is derived at build time
    from the vendored source's ``src/llama-arch.cpp`` (its LLM_ARCH_NAMES
    table, less the "clip" dummy) and read from beside ``llama-server`` here,
    so it always describes the binary that runs."""
    try:
        text = (Path(binary(SERVER)).parent / ARCHITECTURES).read_text()
    except (EngineMissing, OSError):
        return None
    return frozenset(line.strip() for line in text.splitlines() if line.strip())
