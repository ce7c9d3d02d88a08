"""GPU towers without a GPU: truthful caps, several GPUs, VRAM admission, placement.

What a GPU would report is faked per test with named test doubles (llama.cpp's
device list, nvidia-smi, torch's CUDA calls); what this machine really has is
checked against the real llama.cpp build and the real bundled model: the
build's own device list, llama.cpp's own buffer report in a runner's log
after a load, and a registry that is told "there is a GPU" while llama.cpp
really keeps the model on the CPU, which must make the caps say cpu.
"""

import os
import types

import pytest

from announce import caps as c
from announce.table import TowerEntry
from links.wire import Code, WireError
from reticulum_grid.client import router
from reticulum_grid.inference import registry as reg
from reticulum_grid.inference.placement import LoadError, parse_placement
from reticulum_grid.node import engine, hardware
from reticulum_grid.node.config import ModelConfig
from reticulum_grid.store.blobstore import BlobStore

H200 = "NVIDIA H200"


def gpu(index, free, total=143771, name=H200):
    return hardware.Gpu(index, "cuda", name, total, free)


def fake_machine(monkeypatch, offload, gpus):
    """Test double: llama.cpp's device list (and so its offload support) as given."""
    monkeypatch.setattr(hardware, "gpu_offload", lambda: offload)
    monkeypatch.setattr(hardware, "gpu_devices", lambda: list(gpus))


# -- caps: several GPUs within the announce budget ----------------------------

def test_multi_gpu_caps_round_trip():
    caps = c.Caps(name="rig", hardware=c.Hardware("cuda", H200, 4 * 143771, 4 * 140000, 2_000_000, 1_900_000, gpus=4))
    assert c.decode(c.encode(caps)) == caps


def test_worst_case_bare_caps_leave_room_for_models():
    """Every field at its largest, 64 GPUs: the caps without models stay well
    under the budget, and with many models they are trimmed to fit it."""
    hw = c.Hardware("cuda", "D" * c.DEVICE_MAX_BYTES, c.MAX_MIB, c.MAX_MIB, c.MAX_MIB, c.MAX_MIB, gpus=c.MAX_GPUS)
    bare = c.Caps(name="x" * c.NAME_MAX_BYTES, hardware=hw, load=c.Load(c.MAX_COUNT, c.MAX_COUNT, c.MAX_COUNT),
                  tokens_per_s=99999.9)
    size = len(c.encode(bare))
    print(f"worst-case caps without models, {c.MAX_GPUS} GPUs: {size} bytes (budget {c.CAPS_BUDGET})")
    assert size <= c.CAPS_BUDGET - 2 * 45, "room for at least two model entries of the longest alias"
    full = c.Caps(**{**bare.__dict__, "models": tuple(c.ModelCap("m" * 32, bytes([i]) * 4, True) for i in range(9))})
    data = c.encode(full)
    assert len(data) <= c.CAPS_BUDGET and c.decode(data).hardware.gpus == c.MAX_GPUS


@pytest.mark.parametrize("value, reason", [(c.MAX_GPUS + 1, "gpu count 65 outside"), (-1, "gpu count -1 outside"),
                                           (True, "gpu count is bool"), ("2", "gpu count is str")])
def test_rejects_bad_gpu_count(value, reason):
    import msgpack
    raw = msgpack.unpackb(c.encode(c.Caps(name="t")), raw=False)
    raw["hw"][6] = value
    with pytest.raises(c.CapsError, match=reason):
        c.decode(msgpack.packb(raw, use_bin_type=True))


# -- the hardware probe: what llama.cpp can use, nothing else ----------------

def test_no_gpu_offload_means_a_cpu_tower(monkeypatch):
    fake_machine(monkeypatch, offload=False, gpus=[gpu(0, 140000)])
    hw, gpus = hardware.snapshot()
    assert (hw.backend, hw.vram_total_mib, hw.vram_free_mib, hw.gpus, gpus) == ("cpu", 0, 0, 0, ())
    assert hw.memory_free_mib == hw.ram_free_mib > 0


def test_offload_without_a_device_is_a_cpu_tower(monkeypatch):
    fake_machine(monkeypatch, offload=True, gpus=[])
    assert hardware.probe().backend == "cpu"


def test_two_gpus_are_summed_and_counted(monkeypatch):
    fake_machine(monkeypatch, offload=True, gpus=[gpu(0, 100000), gpu(1, 50000)])
    hw, gpus = hardware.snapshot()
    assert (hw.backend, hw.device, hw.vram_total_mib, hw.vram_free_mib, hw.gpus) == (
        "cuda", H200, 2 * 143771, 150000, 2)
    assert [g.free_mib for g in gpus] == [100000, 50000]
    fake_machine(monkeypatch, offload=True, gpus=[gpu(0, 20000, 24564, "NVIDIA GeForce RTX 4090"),
                                                  gpu(1, 20000, 24576, "NVIDIA GeForce RTX 3090")])
    assert hardware.probe().device == "NVIDIA GeForce RTX 4090 + NVIDIA GeForce RTX 3090"[:c.DEVICE_MAX_BYTES]


def test_cached_probe_gives_the_gpu_list_of_its_reading(monkeypatch):
    fake_machine(monkeypatch, offload=True, gpus=[gpu(0, 1000), gpu(1, 2000)])
    probe = hardware.CachedProbe(ttl_s=60)
    assert probe().gpus == 2 and [g.index for g in probe.gpus] == [0, 1]


def test_unused_nvidia_gpu_is_warned_about_with_the_fix():
    smi = [(H200, 143771, 143000)]
    warning = hardware.unused_gpu_warning(smi, offload=False, devices=[], nvcc=True)
    assert "1 NVIDIA GPU(s) (NVIDIA H200)" in warning and "built without CUDA" in warning
    assert f"`{hardware.CUDA_FIX}`" in warning and "announces backend cpu" in warning
    assert "install" in hardware.unused_gpu_warning(smi, offload=False, devices=[], nvcc=False)
    assert "sees none of them" in hardware.unused_gpu_warning(smi, offload=True, devices=[])
    assert hardware.unused_gpu_warning(smi, offload=True, devices=[gpu(0, 1)]) is None
    assert hardware.unused_gpu_warning([], offload=False) is None


#: Test double: what `llama-server --list-devices` prints on a two-GPU box with an RPC server added
#: (common_print_available_devices of the pinned llama.cpp).
LISTED = """Available devices:
  CUDA0: NVIDIA H200 (143771 MiB, 143000 MiB free)
  CUDA1: NVIDIA H200 (143771 MiB, 150000 MiB free)
  RPC0[127.0.0.1:50052]: RPC0[127.0.0.1:50052] (8000 MiB, 7000 MiB free)
"""


def test_device_list_as_llama_cpp_prints_it():
    devices = engine.parse_devices(LISTED)
    assert [(d.name, d.backend, d.description, d.total_mib, d.free_mib) for d in devices] == [
        ("CUDA0", "cuda", H200, 143771, 143000), ("CUDA1", "cuda", H200, 143771, 143771),
        ("RPC0[127.0.0.1:50052]", "rpc", "RPC0[127.0.0.1:50052]", 8000, 7000)]
    assert engine.parse_devices("Available devices:\n  (none)\n") == []


def test_real_device_list_on_this_machine():
    """The installed build itself: it runs, and no GPU is claimed here (the machine has none)."""
    assert engine.build_info().startswith("version:")
    if not os.path.exists("/dev/nvidia0"):
        assert engine.list_devices() == [] and hardware.gpu_devices() == [] and hardware.probe().backend == "cpu"


# -- placement: llama.cpp's own report of where the model went ---------------

#: Test double: the buffer lines a CUDA load logs, in llama.cpp's format
#: (llama-model.cpp, llama-kv-cache.cpp, llama-context.cpp of the pinned
#: release), for SmolLM2-135M on one GPU.
CUDA_LOAD_LOG = """load_tensors: offloading 30 repeating layers to GPU
load_tensors: offloaded 31/31 layers to GPU
load_tensors:        CUDA0 model buffer size =    71.07 MiB
load_tensors:   CPU_Mapped model buffer size =    27.00 MiB
llama_context:  CUDA_Host  output buffer size =     0.19 MiB
llama_kv_cache:      CUDA0 KV buffer size =    90.00 MiB
llama_context:      CUDA0 compute buffer size =    97.00 MiB
llama_context:  CUDA_Host compute buffer size =     5.13 MiB
"""


def test_placement_of_a_cuda_load():
    p = parse_placement(CUDA_LOAD_LOG)
    assert p.offloaded and p.mib(True, "model") == 71 and p.mib(False, "model") == 27
    assert p.mib(True) == 258 and p.mib(False) == 32  # CUDA_Host is pinned host memory


def test_placement_of_a_cpu_load_or_a_remote_one():
    cpu = parse_placement(CUDA_LOAD_LOG.replace("CUDA0", "CPU").replace("CUDA_Host", "CPU"))
    assert not cpu.offloaded and cpu.mib(True) == 0
    remote = parse_placement(CUDA_LOAD_LOG.replace("CUDA0", "RPC0[127.0.0.1:50052]"))
    assert not remote.offloaded, "weights on another machine's device are not this tower's GPU"


@pytest.mark.parametrize("host", ["CPU_REPACK", "AMX", "CPU_Mapped", "Metal_Host"])
def test_cpu_side_buffers_of_any_name_are_not_a_gpu(host):
    repacked = parse_placement(CUDA_LOAD_LOG.replace("CUDA0", host))
    assert not repacked.offloaded and repacked.mib(True) == 0
    metal = parse_placement(CUDA_LOAD_LOG.replace("CUDA0", "MTL0"))
    assert metal.offloaded


def test_out_of_memory_is_recognised_in_the_log():
    assert LoadError("Failed to load model", "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 80000.00 MiB "
                     "on device 0: cudaMalloc failed: out of memory").out_of_memory
    assert not LoadError("Failed to load model", "llama_model_load: error loading model: bad magic").out_of_memory


def test_real_load_reports_the_model_in_host_memory(model_path, tmp_path):
    from reticulum_grid.inference.runner import Runner
    from reticulum_grid.inference.runner_spec import RunnerSpec
    runner = Runner(RunnerSpec(str(model_path), n_ctx=512, threads=1), tmp_path / "runner.log").start()
    try:
        p = runner.placement
        file_mib = os.path.getsize(model_path) / (1 << 20)
        assert not p.offloaded and p.mib(True) == 0
        assert abs(p.mib(False, "model") - file_mib) < 0.1 * file_mib, (p.buffers, file_mib)
        assert p.mib(False, "KV") > 0
    finally:
        runner.close()


# -- several GPUs: where a model goes, what it needs -------------------------

def test_tensor_split_by_free_memory():
    assert reg.tensor_split([], 1000) is None and reg.tensor_split([gpu(0, 5000)], 1000) is None
    assert reg.tensor_split([gpu(0, 3000), gpu(1, 9000)], 8000) == [0.0, 1.0], "fits on one: keep it whole"
    assert reg.tensor_split([gpu(0, 3000), gpu(1, 9000)], 11000) == [0.25, 0.75]
    assert reg.need_on(8000, [gpu(0, 3000), gpu(1, 9000)]) == 8000
    assert reg.need_on(11000, [gpu(0, 3000), gpu(1, 9000)]) == 11000 + reg.gguf_info.RUNTIME_OVERHEAD_MIB


def tower(name, free_vram, gpus):
    hw = c.Hardware("cuda", H200, 24000 * gpus, free_vram, 64000, 60000, gpus=gpus)
    caps = c.Caps(name=name, hardware=hw, models=(c.ModelCap("m", b"abcd", False),), tokens_per_s=100.0)
    return TowerEntry(name.encode().ljust(16, b"\0"), caps, 1, 0.0)


def test_router_counts_free_vram_across_gpus():
    two = tower("two", free_vram=2 * 20000, gpus=2)
    one = tower("one", free_vram=30000, gpus=1)
    assert router.choose([one, two], "m", need_mib=35000) is two, "40 GB over two GPUs holds a 35 GB model"
    assert not router.rank([two], "m", need_mib=35000)[0].reasons["no_room"]
    tight = tower("tight", free_vram=35050, gpus=2)
    reasons = router.rank([tight], "m", need_mib=35000)[0].reasons
    assert reasons["partial"], "two GPUs, two compute buffers: it does not fit in VRAM alone"
    assert not reasons["no_room"], "the 60 GB of free RAM take the layers the GPUs cannot"
    assert router.rank([one, two], "m", need_mib=35000)[0].entry is two, "whole on the GPUs beats partly in RAM"
    assert router.rank([tight], "m", need_mib=100_000)[0].reasons["no_room"], "not even VRAM and RAM together"


# -- the registry: admission, truthful caps ----------------------------------

@pytest.fixture(scope="module")
def smol_need(model_path):
    """The real need estimate (MiB) for n_ctx 512, read once (reading the GGUF takes seconds)."""
    return reg.gguf_info.need_mib(model_path, 512, os.path.getsize(model_path))


@pytest.fixture
def registry(tmp_path, model_path, smol_need):
    registry = reg.ModelRegistry(BlobStore(tmp_path / "blobs"), [ModelConfig("smol", str(model_path), n_ctx=512,
                                                                             threads=1, parallel=1)],
                                 log_dir=tmp_path)
    registry.find("smol").need_mib = smol_need  # what registry.need_mib would compute, cached as it does
    yield registry
    registry.close()


def fake_gpus(monkeypatch, *free, ram_free=60000):
    """Test double: llama.cpp offload and CUDA GPUs with these free MiB (and this much free RAM)."""
    gpus = tuple(gpu(i, f, total=max(f, 1000)) for i, f in enumerate(free))
    hw = c.Hardware("cuda", H200, sum(g.total_mib for g in gpus), sum(free), 64000, ram_free, gpus=len(gpus))
    monkeypatch.setattr(hardware, "snapshot", lambda: (hw, gpus))
    return hw


def test_admission_refuses_a_model_that_does_not_fit(monkeypatch, registry):
    fake_gpus(monkeypatch, 60, 50, ram_free=reg.PARTIAL_RAM_HEADROOM_MIB + 100)
    slot = registry.find("smol")
    with pytest.raises(WireError) as e:
        registry.runner(slot)
    assert e.value.code == Code.INSUFFICIENT_MEMORY
    need = registry.need_mib(slot) + reg.gguf_info.RUNTIME_OVERHEAD_MIB  # split over two GPUs: two compute buffers
    assert f"needs ~{need} MiB" in e.value.message and "210 MiB free in this tower's 2 GPU(s)" in e.value.message
    assert not slot.loaded


def test_a_model_too_big_for_the_vram_loads_partly_in_ram(monkeypatch, registry):
    """The fake GPU holds 60 MiB, the free RAM the rest: llama.cpp chooses the
    layers that fit (--fit on, no -ngl); the real build here has no GPU and so
    keeps them all on the CPU, and the caps say cpu."""
    hw = fake_gpus(monkeypatch, 60)
    slot = registry.find("smol")
    runner = registry.runner(slot)
    assert runner.spec.fit and slot.partial and "-ngl" not in runner.spec.argv(1)
    assert ["--fit", "on"] == runner.spec.argv(1)[runner.spec.argv(1).index("--fit"):][:2]
    assert slot.offloaded is False and registry.truthful(hw).backend == "cpu"


def test_caps_say_cpu_when_llama_cpp_keeps_the_model_off_the_gpu(monkeypatch, registry):
    """The fake says "two GPUs"; the real llama.cpp here loads the model on
    the CPU; its buffer report tells, and the caps say cpu."""
    hw = fake_gpus(monkeypatch, 20000, 30000)
    assert registry.truthful(hw) == hw, "nothing loaded yet: the machine's own figures"
    slot = registry.find("smol")
    registry.runner(slot)
    assert slot.offloaded is False and slot.vram_mib == 0
    said = registry.truthful(hw)
    assert (said.backend, said.vram_total_mib, said.gpus, said.ram_free_mib) == ("cpu", 0, 0, hw.ram_free_mib)
    info = registry.placement_info(slot)
    assert info["on_gpu"] is False and info["host_model_mib"] > 0 and info["gpu_mib"] == 0
    slot.offloaded = True  # as a GPU load would have it
    assert registry.truthful(hw) == hw


def test_a_configured_model_that_does_not_fit_leaves_the_tower_serving(monkeypatch, registry):
    fake_gpus(monkeypatch, 10, ram_free=100)  # not in VRAM, not in VRAM and RAM together
    registry.load_configured()  # logged, not raised
    assert not registry.find("smol").loaded


# -- training: device and precision ------------------------------------------

class FakeTorch:
    """Test double for the torch calls pick_device makes."""

    def __init__(self, free=(), bf16=True, mps=False):
        self.free, self.chosen = list(free), None
        self.cuda = types.SimpleNamespace(
            is_available=lambda: bool(self.free), device_count=lambda: len(self.free),
            mem_get_info=lambda i: (self.free[i], 80 << 30), set_device=lambda i: setattr(self, "chosen", i),
            get_device_name=lambda i: f"GPU{i}", is_bf16_supported=lambda: bf16)
        self.backends = types.SimpleNamespace(mps=types.SimpleNamespace(is_available=lambda: mps))


def test_training_device_and_precision():
    from reticulum_grid.training.trainer import pick_device
    torch = FakeTorch(free=[10 << 30, 50 << 30, 20 << 30])
    assert pick_device(torch) == ("cuda:1", "GPU1", "bf16") and torch.chosen == 1
    assert pick_device(FakeTorch(free=[1 << 30], bf16=False))[2] == "fp16", "pre-Ampere: fp16 with a scaler"
    assert pick_device(FakeTorch(mps=True))[::2] == ("mps", "fp32")
    device, name, precision = pick_device(FakeTorch())
    assert (device, precision) == ("cpu", "fp32") and name


def test_a_local_spec_may_ask_for_bf16_anywhere():
    """The GPU check compares the GPU and the CPU at one precision: a worker
    spec's "precision" (never a request's) replaces the choice."""
    from reticulum_grid.training.trainer import pick_device
    assert pick_device(FakeTorch(), "bf16")[::2] == ("cpu", "bf16")
    assert pick_device(FakeTorch(free=[1 << 30], bf16=False), "bf16")[::2] == ("cuda:0", "bf16")
    assert pick_device(FakeTorch(free=[1 << 30]), "fp32")[2] == "fp32"
    with pytest.raises(ValueError, match="precision must be bf16 or fp32"):
        pick_device(FakeTorch(), "fp8")
