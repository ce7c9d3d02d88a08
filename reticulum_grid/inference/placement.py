"""Where llama.cpp put a model, in its own words (the runner's log).

llama.cpp logs one line per buffer it allocates while loading a model and
making its context ("load_tensors:  CUDA0 model buffer size = 60.00 MiB",
"llama_kv_cache:  CUDA0 KV buffer size = ...", "... compute buffer size = ...").
Reading those lines says which device really holds the weights, the KV cache
and the compute buffers: a truthful check after load, whatever ``n_gpu_layers``
asked for, for CUDA, Metal and the other GPU backends alike.
"""

import re
from dataclasses import dataclass, field


class LoadError(ValueError):
    """llama.cpp could not load the model; ``out_of_memory`` when its log says
    an allocation failed, ``buffer`` the buffer type it could not allocate
    ("CPU", "CUDA0", "RPC0[127.0.0.1:50052]"; "" when it names none),
    ``stuck`` when loading stopped making progress."""

    def __init__(self, message: str, log_text: str = "") -> None:
        super().__init__(message)
        self.out_of_memory = bool(_OOM.search(log_text))
        failed = _UNALLOCATED.findall(log_text)
        self.buffer: str = failed[-1] if failed else ""
        self.stuck = False


#: llama.cpp's buffer report: "load_tensors:  CUDA0 model buffer size = 60.00 MiB".
_BUFFER = re.compile(r"(\S+)\s+(model|KV|compute|output|LoRA) buffer size\s*=\s*([0-9.]+) MiB")
#: Buffer name prefixes of llama.cpp's GPU backends (ggml-cuda, -hip, -metal, -vulkan, -sycl, -cann, -musa, -opencl).
GPU_BUFFERS = ("CUDA", "ROCm", "HIP", "MTL", "Metal", "Vulkan", "SYCL", "CANN", "MUSA", "OpenCL")
_OOM = re.compile(r"out of memory|failed to allocate|unable to allocate", re.IGNORECASE)
#: llama.cpp's words when a model's buffer cannot be had (src/llama-model.cpp, load_tensors).
_UNALLOCATED = re.compile(r"unable to allocate (\S+) buffer")


@dataclass(frozen=True)
class Placement:
    """Where llama.cpp put a model: {(buffer, kind): MiB} from its load log.
    A buffer is on a GPU when a GPU backend names it (GPU_BUFFERS) and it is
    not that backend's host memory (*_Host); CPU buffers of any kind (CPU,
    CPU_Mapped, CPU_REPACK, AMX) and remote RPC devices are not."""
    buffers: dict[tuple[str, str], float] = field(default_factory=dict)

    @staticmethod
    def on_gpu(buffer: str) -> bool:
        return buffer.startswith(GPU_BUFFERS) and not buffer.endswith("_Host")

    def mib(self, gpu: bool, kind: str | None = None) -> int:
        """MiB on GPUs (``gpu`` True) or in host memory, of one kind or all."""
        return round(sum(v for (b, k), v in self.buffers.items() if self.on_gpu(b) == gpu and kind in (None, k)))

    @property
    def offloaded(self) -> bool:
        """True when most model weights sit on a GPU (the input embeddings
        always stay in host memory, so "all" is not the test)."""
        return self.mib(True, "model") > self.mib(False, "model")


def parse_placement(log_text: str) -> Placement:
    """Placement from llama.cpp log text (lines as llama.cpp prints them)."""
    buffers: dict[tuple[str, str], float] = {}
    for buffer, kind, mib in _BUFFER.findall(log_text):
        buffers[(buffer, kind)] = buffers.get((buffer, kind), 0.0) + float(mib)
    return Placement(buffers)
