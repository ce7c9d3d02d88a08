"""What this machine offers: compute backend, GPUs, VRAM and RAM (MiB).

The GPUs are the ones llama.cpp itself can use: the tower's llama-server
lists them (``--list-devices``, node/engine.py) in llama.cpp's own order (the
order ``--tensor-split`` follows; CUDA_VISIBLE_DEVICES honoured), asked once
per tower process. So a tower never claims a GPU its inference engine cannot
use: a build that lists none makes a CPU tower with VRAM 0, and routing uses
its free RAM. Free memory is read live: NVIDIA GPUs from ``nvidia-smi`` (in
PCI bus order, the order the runners are started with:
CUDA_DEVICE_ORDER=PCI_BUS_ID), other GPUs as llama.cpp listed them (Apple's
unified memory: no more than the RAM available). The tower process itself
never loads a GPU driver. ``nvidia-smi`` also notices an NVIDIA GPU that this
llama.cpp build cannot use (``unused_gpu_warning``). RAM comes from psutil,
within the memory limit of the container the tower runs in (node/cgroup.py).
"""

import os
import platform
import shutil
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import psutil

from announce.caps import BACKENDS, DEVICE_MAX_BYTES, Hardware
from reticulum_grid.node.engine import Device
from reticulum_grid.node import cgroup, engine

MIB = 1024 * 1024
#: The command that rebuilds llama.cpp (and torch) for CUDA, run in the checkout.
CUDA_FIX = "make llama LLAMA_BACKEND=cuda"


@dataclass(frozen=True)
class Gpu:
    """One GPU llama.cpp can use. ``index``: its place among llama.cpp's GPU
    devices (tensor_split order); memory in MiB."""
    index: int
    backend: str
    name: str
    total_mib: int
    free_mib: int


def snapshot() -> tuple[Hardware, tuple[Gpu, ...]]:
    """(Hardware, tuple of Gpu) now. Takes milliseconds; callers cache it."""
    ram_total, ram_free = ram_mib()
    gpus = tuple(gpu_devices()) if gpu_offload() else ()
    if not gpus:
        return Hardware("cpu", cpu_label(), 0, 0, ram_total, ram_free), ()
    total = sum(g.total_mib for g in gpus)
    free = sum(g.free_mib for g in gpus)
    return Hardware(gpus[0].backend, _clip(device_label(gpus)), total, free, ram_total, ram_free, gpus=len(gpus)), gpus


def ram_mib() -> tuple[int, int]:
    """(total, free) RAM in MiB this process may use: the host's (psutil; free
    is its "available"), within a container's memory limit (node/cgroup.py)."""
    ram = psutil.virtual_memory()
    total, free = ram.total, ram.available
    limit = cgroup.memory_limit()
    if limit is not None:
        total, free = min(total, limit.limit), min(free, limit.free)
    return total // MIB, free // MIB


def probe() -> Hardware:
    """Current Hardware (GPU figures summed over the GPUs)."""
    return snapshot()[0]


class CachedProbe:
    """snapshot() at most once every ``ttl_s`` seconds; call for the Hardware,
    ``.gpus`` for the GPU list of the same reading."""

    def __init__(self, ttl_s: float = 5.0) -> None:
        self.ttl_s = ttl_s
        self._value: Hardware | None = None
        self._gpus: tuple[Gpu, ...] = ()
        self._at = 0.0

    def __call__(self) -> Hardware:
        now = time.monotonic()
        if self._value is None or now - self._at > self.ttl_s:
            (self._value, self._gpus), self._at = snapshot(), now
        return self._value

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        self()
        return self._gpus


def device_label(gpus: Iterable[Gpu]) -> str:
    """"NVIDIA H200" for one GPU or several of one model, else the names joined by " + "."""
    names = list(dict.fromkeys(g.name for g in gpus))
    return names[0] if len(names) == 1 else " + ".join(names)


def gpu_offload() -> bool:
    """True when this llama.cpp build can put layers on a GPU of this machine."""
    return bool(_listed())


def gpu_devices() -> list[Gpu]:
    """The GPUs llama.cpp uses, as Gpu, in its order, with free memory now; []
    when it sees none. Remote (RPC) devices are other machines' and are left out."""
    listed = _listed()
    smi = nvidia_smi_gpus() if any(d.backend == "cuda" for d in listed) else []
    ram_free = ram_mib()[1]
    out = []
    for i, d in enumerate(listed):
        free = d.free_mib
        if d.backend == "cuda" and i < len(smi):
            free = smi[i][2]
        elif d.backend == "metal":
            free = min(d.free_mib, ram_free)
        out.append(Gpu(i, d.backend, d.description, d.total_mib, min(free, d.total_mib)))
    return out


def first_gpu_name() -> str:
    """This machine's first GPU as llama.cpp names it ("CUDA0"), "" without one."""
    listed = _listed()
    return listed[0].name if listed else ""


_devices: list[Device] | None = None


def _listed() -> list[Device]:
    """The GPU devices llama.cpp lists, asked once per process (engine.list_devices)."""
    global _devices
    if _devices is None:
        _devices = [d for d in engine.list_devices() if d.backend in BACKENDS and d.backend != "cpu"]
    return _devices


def nvidia_smi_gpus() -> list[tuple[str, int, int]]:
    """[(name, total MiB, free MiB)] for each GPU nvidia-smi lists; [] without it."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True).stdout
        rows = [[x.strip() for x in line.split(",")] for line in out.splitlines() if line.strip()]
        return [(name, int(total), min(int(free), int(total))) for name, total, free in rows]
    except (subprocess.SubprocessError, OSError, ValueError):
        return []


def unused_gpu_warning(smi_gpus: Sequence[tuple[str, int, int]] | None = None, offload: bool | None = None,
                       devices: Sequence[Gpu] | None = None, nvcc: bool | None = None) -> str | None:
    """A warning when the machine has NVIDIA GPUs that llama.cpp does not use
    (with the command that fixes it), else None. Arguments default to the
    live readings."""
    smi_gpus = nvidia_smi_gpus() if smi_gpus is None else smi_gpus
    if not smi_gpus:
        return None
    offload = gpu_offload() if offload is None else offload
    devices = (gpu_devices() if offload else []) if devices is None else devices
    if any(g.backend == "cuda" for g in devices):
        return None
    names = device_label([Gpu(i, "cuda", n, t, f) for i, (n, t, f) in enumerate(smi_gpus)])
    head = f"this machine has {len(smi_gpus)} NVIDIA GPU(s) ({names}) but "
    if offload:
        why = ("llama.cpp sees none of them (driver and CUDA runtime disagree, or CUDA_VISIBLE_DEVICES hides them), "
               "so this tower runs models on the CPU and announces backend cpu. Check `nvidia-smi` and the driver.")
        return head + why
    nvcc = bool(shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc")) if nvcc is None else nvcc
    fix = f"`{CUDA_FIX}` in the reticulum_grid checkout" + (
        "" if nvcc else " after installing the CUDA toolkit (nvcc not found)")
    return head + ("llama.cpp was built without CUDA, so this tower runs models on the CPU and announces "
                   f"backend cpu. Fix: {fix}, then restart the tower.")


def cpu_label() -> str:
    """This machine's CPU model, clipped to what caps carry."""
    return _clip(cpu_name())


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _clip(text: str) -> str:
    data = " ".join(text.split()).encode("utf-8")[:DEVICE_MAX_BYTES]
    return data.decode("utf-8", "ignore")
