"""What this machine offers: compute backend, device name, VRAM and RAM (MiB).

VRAM comes from ``nvidia-smi`` (NVIDIA's own tool, present wherever the CUDA
driver is) when llama.cpp was built with GPU offload; otherwise the tower is a
CPU (or Apple unified-memory) tower and VRAM is reported as 0, so routing uses
free RAM. RAM comes from psutil.
"""

import platform
import shutil
import subprocess
import sys
import time

import psutil

from announce.caps import DEVICE_MAX_BYTES, Hardware

MIB = 1024 * 1024


def probe():
    """Current Hardware. Takes ~0.1 s with nvidia-smi; callers cache it."""
    ram = psutil.virtual_memory()
    ram_total, ram_free = ram.total // MIB, ram.available // MIB
    backend, device, vram_total, vram_free = "cpu", _cpu_name(), 0, 0
    if _gpu_offload():
        gpu = _nvidia()
        if gpu is not None:
            backend, (device, vram_total, vram_free) = "cuda", gpu
        elif sys.platform == "darwin":
            backend, device = "metal", platform.machine() + " " + _cpu_name()
    return Hardware(backend, _clip(device), vram_total, vram_free, ram_total, ram_free)


class CachedProbe:
    """probe() at most once every ``ttl_s`` seconds."""

    def __init__(self, ttl_s=5.0):
        self.ttl_s = ttl_s
        self._value, self._at = None, 0.0

    def __call__(self):
        now = time.monotonic()
        if self._value is None or now - self._at > self.ttl_s:
            self._value, self._at = probe(), now
        return self._value


def _gpu_offload():
    try:
        import llama_cpp
        return bool(llama_cpp.llama_supports_gpu_offload())
    except Exception:
        return False


def _nvidia():
    """(name, total MiB, free MiB) of the first NVIDIA GPU, or None."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=5, check=True).stdout
        name, total, free = [x.strip() for x in out.splitlines()[0].split(",")]
        return name, int(total), min(int(free), int(total))
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        return None


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _clip(text):
    data = " ".join(text.split()).encode("utf-8")[:DEVICE_MAX_BYTES]
    return data.decode("utf-8", "ignore")
