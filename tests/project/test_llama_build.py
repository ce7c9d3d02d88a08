"""scripts/llama_build.py and scripts/llama_flags.py: backend choice, build flags, torch choice and the dry run.

Unit tests of the set-up script; the machine it inspects (nvcc, nvidia-smi,
platform, /proc/cpuinfo) is replaced per test by named fakes, and nothing is
built or installed. The real build is what `make setup` runs; that its result
works is what every test starting a tower shows, and
test_installed_binaries_run checks it directly.
"""

import subprocess
from pathlib import Path

import pytest

from scripts import llama_build as lw
from scripts import llama_flags as lf

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("override, system, machine, nvcc, gpus, expected", [
    ("", "Linux", "x86_64", "/usr/local/cuda/bin/nvcc", 1, "cuda"),
    ("", "Linux", "x86_64", "/usr/bin/nvcc", 4, "cuda"),
    ("", "Linux", "x86_64", "/usr/bin/nvcc", 0, "cpu"),      # toolkit, no GPU: `native` has nothing to detect
    ("", "Linux", "x86_64", None, 2, "cpu"),                 # GPU, no toolkit: cannot build CUDA
    ("", "Linux", "aarch64", None, 0, "cpu"),
    ("", "Darwin", "arm64", None, 0, "metal"),
    ("", "Darwin", "x86_64", None, 0, "cpu"),                # Intel Macs: no Metal build by default
    ("cpu", "Linux", "x86_64", "/usr/bin/nvcc", 1, "cpu"),   # the override wins every time
    ("cuda", "Linux", "x86_64", None, 0, "cuda"),
    ("metal", "Linux", "x86_64", None, 0, "metal"),
    ("cpu", "Darwin", "arm64", None, 0, "cpu"),
])
def test_choose_backend(override, system, machine, nvcc, gpus, expected):
    assert lf.choose_backend(override, system, machine, nvcc, gpus) == expected


def test_unknown_override_is_refused():
    with pytest.raises(ValueError, match="LLAMA_BACKEND must be one of cuda, metal, cpu, not 'rocm'"):
        lf.choose_backend("rocm", "Linux", "x86_64", None, 0)


def test_gpu_without_toolkit_warns_with_the_fix():
    warning = lf.missing_toolkit_warning("cpu", "", None, 2)
    assert "2 NVIDIA GPU(s)" in warning and "make llama LLAMA_BACKEND=cuda" in warning
    assert lf.missing_toolkit_warning("cpu", "cpu", None, 2) is None, "an explicit cpu build is a choice"
    assert lf.missing_toolkit_warning("cpu", "", None, 0) is None
    assert lf.missing_toolkit_warning("cuda", "", "/usr/bin/nvcc", 1) is None


@pytest.mark.parametrize("caps, expected", [
    (["9.0"], "90"),
    (["8.6", "8.9", "8.6"], "86;89"),
    (["12.0", "8.9"], "89;120"),
    ([], "native"),
    (["[N/A]"], "native"),
])
def test_cuda_architectures_from_compute_caps(caps, expected):
    assert lf.cuda_architectures(caps) == expected


def test_cmake_args_keep_rpc_on_for_every_backend():
    for backend in lf.BACKENDS:
        assert "-DGGML_RPC=ON" in lf.cmake_args(backend) and "-DLLAMA_BUILD_SERVER=ON" in lf.cmake_args(backend)
    assert lf.cmake_args("metal")[-1] == "-DGGML_METAL=ON"
    assert lf.cmake_args("cuda", "90")[-2:] == ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90"]
    assert not any("CUDA" in a or "METAL" in a for a in lf.cmake_args("cpu"))


def test_nothing_in_the_build_reaches_a_network():
    args = lf.cmake_args("cpu")
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in args and "-DLLAMA_BUILD_UI=OFF" in args and "-DLLAMA_OPENSSL=OFF" in args


XEON_FLAGS = "fpu sse4_2 avx f16c fma bmi2 avx2 avx512f avx512cd avx512vl avx512dq avx512bw avx512_vnni amx_tile " \
             "amx_int8 amx_bf16 avx_vnni".split()


def test_x86_builds_name_the_cpu_features_but_never_amx():
    args = lf.cpu_args("Linux", "x86_64", XEON_FLAGS)
    assert "-DGGML_NATIVE=OFF" in args and "-DGGML_AVX512=ON" in args and "-DGGML_AVX2=ON" in args
    assert "-DGGML_AVX512_VNNI=ON" in args and not any("AMX" in a for a in args)
    assert "-DGGML_AVX512=ON" not in lf.cpu_args("Linux", "x86_64", ["avx2", "avx512f"]), "AVX512 needs all five"
    assert lf.cpu_args("Darwin", "arm64", XEON_FLAGS) == [], "elsewhere -march=native"
    assert lf.cpu_args("Linux", "aarch64", XEON_FLAGS) == []


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert lf.linux_cpu_flags(info) == ["fpu", "avx2", "fma"]
    assert lf.linux_cpu_flags(tmp_path / "missing") == []


def test_build_dir_is_keyed_by_source_and_flags(tmp_path):
    a = lw.build_dir("cuda", "llama-cpp-python==0.3.36", lf.cmake_args("cuda", "90"), cache=tmp_path)
    assert a == lw.build_dir("cuda", "llama-cpp-python==0.3.36", lf.cmake_args("cuda", "90"), cache=tmp_path)
    assert a.parent == tmp_path and a.name.startswith("cuda-")
    assert a != lw.build_dir("cuda", "llama-cpp-python==0.3.36", lf.cmake_args("cuda", "89"), cache=tmp_path), \
        "another GPU"
    assert a != lw.build_dir("cuda", "llama-cpp-python==0.3.37", lf.cmake_args("cuda", "90"), cache=tmp_path)


def test_build_commands_point_cmake_at_nvcc(tmp_path):
    configure, build = lw.build_commands(tmp_path / "src", tmp_path / "house", lf.cmake_args("cuda", "90"),
                                         "/opt/cuda/bin/nvcc", jobs=16)
    assert configure[1]["CUDACXX"] == "/opt/cuda/bin/nvcc" and "-DCMAKE_CUDA_ARCHITECTURES=90" in configure[0]
    assert configure[0][:3] == ["cmake", "-S", str(tmp_path / "src")]
    assert build[0][-3:] == ["--target", "llama-server", "ggml-rpc-server"] and "16" in build[0]
    assert "CUDACXX" not in lw.build_commands(tmp_path, tmp_path, lf.cmake_args("cpu"))[0][1]


def test_torch_choice_per_backend():
    reachable_double = lambda url: True    # test double: PyTorch's index answers
    unreachable_double = lambda url: False  # test double: it does not (e.g. an offline CI machine)
    assert lw.torch_command("pip", "torch==2.13.0", "cpu", "Linux", cpu_index_reachable=reachable_double) == [
        "pip", "install", "torch==2.13.0", "--extra-index-url", lw.CPU_TORCH_INDEX]
    assert lw.torch_command("pip", "torch==2.13.0", "cpu", "Linux", cpu_index_reachable=unreachable_double) == [
        "pip", "install", "torch==2.13.0"]

    def never(url):
        raise AssertionError("a CUDA or Metal tower must not ask for the CPU index")

    assert lw.torch_command("pip", "torch==2.13.0", "cuda", "Linux", cpu_index_reachable=never) == [
        "pip", "install", "torch==2.13.0"]
    assert lw.torch_command("pip", "torch==2.13.0", "metal", "Darwin", cpu_index_reachable=never) == [
        "pip", "install", "torch==2.13.0"]
    assert lw.torch_command("pip", "torch==2.13.0", "cuda", "Linux", "https://idx/cu128") == [
        "pip", "install", "torch==2.13.0", "--index-url", "https://idx/cu128"]


def test_the_source_pin_comes_from_pyproject():
    import tomllib
    pin = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["rngrid"]["llama"]
    source, sha = lw.pinned_source()
    assert (source, sha) == (pin["source"], pin["sha256"])
    assert source.startswith("llama-cpp-python==") and len(sha) == 64 and int(sha, 16) >= 0


def test_the_pin_is_read_from_the_pyproject_given(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool.rngrid.llama]\nsource = "llama-cpp-python==9.8.7"\nsha256 = "' + "ab" * 32 + '"\n')
    assert lw.pinned_source(pyproject) == ("llama-cpp-python==9.8.7", "ab" * 32)


def test_a_pyproject_without_the_pin_is_refused(tmp_path):
    bare = tmp_path / "pyproject.toml"
    bare.write_text("[project]\nname = 'x'\n")
    with pytest.raises(SystemExit, match="tool.rngrid.llama"):
        lw.pinned_source(bare)


def test_installed_binaries_run():
    """The build `make setup` made: both binaries in the venv answer."""
    import sys
    bindir = Path(sys.executable).parent
    assert lw.check(bindir, "cpu").startswith("version:")


LLAMA_ARCH_CPP = """static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {
    { LLM_ARCH_CLIP,             "clip"             }, // dummy, only used by llama-quantize
    { LLM_ARCH_LLAMA,            "llama"            },
    { LLM_ARCH_QWEN2,            "qwen2"            },
    { LLM_ARCH_UNKNOWN,          "(unknown)"        },
};

static const std::map<llm_kv, const char *> LLM_KV_NAMES = {
    { LLM_KV_GENERAL_TYPE,                     "general.type"                     },
};
"""


def test_the_architecture_list_is_llama_arch_cpps_table_without_the_dummies(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "llama-arch.cpp").write_text(LLAMA_ARCH_CPP)
    lw.write_architectures(tmp_path, tmp_path)
    assert (tmp_path / lw.ARCHITECTURES).read_text() == "llama\nqwen2\n"
    (tmp_path / "src" / "llama-arch.cpp").write_text("// moved elsewhere\n")
    with pytest.raises(SystemExit, match="no LLM_ARCH_NAMES table"):
        lw.architectures(tmp_path)


def test_the_installed_build_lists_the_architectures_it_loads():
    """The list `make setup` wrote beside llama-server, as the tower reads it."""
    from reticulum_grid.node import engine
    known = engine.architectures()
    assert known is not None, f"no {engine.ARCHITECTURES} beside llama-server: run make llama"
    assert {"llama", "qwen2", "gemma3"} <= known and "clip" not in known


def fake_cuda_machine(monkeypatch, tmp_path):
    """Test double for a Linux box with two RTX 4090s (compute 8.9) and nvcc; no
    subprocess may run."""
    monkeypatch.setattr(lw, "find_nvcc", lambda: "/opt/cuda/bin/nvcc")
    monkeypatch.setattr(lw, "nvidia_gpu_count", lambda: 2)
    monkeypatch.setattr(lw, "local_compute_caps", lambda: ["8.9", "8.9"])
    monkeypatch.setattr(lw.platform, "system", lambda: "Linux")
    monkeypatch.setattr(lw.platform, "machine", lambda: "x86_64")
    monkeypatch.setenv("RNGRID_LLAMA_CACHE", str(tmp_path))
    monkeypatch.delenv("LLAMA_BACKEND", raising=False)

    def no_run(*args, **kwargs):
        raise AssertionError(f"dry run ran {args}")

    monkeypatch.setattr(subprocess, "run", no_run)


def test_dry_run_prints_the_cuda_build_for_the_local_architecture(monkeypatch, tmp_path, capsys):
    fake_cuda_machine(monkeypatch, tmp_path)
    monkeypatch.setattr(lw, "linux_cpu_flags", lambda: XEON_FLAGS)
    assert lw.main(["--venv", "venv", "--torch", "torch==2.13.0", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("llama.cpp backend: cuda;") and "-DCMAKE_CUDA_ARCHITECTURES=89" in lines[0]
    torch, configure, build = lines[1:]
    assert torch == "venv/bin/pip install torch==2.13.0", "a CUDA tower takes PyPI's CUDA torch"
    assert configure.startswith("CUDACXX='/opt/cuda/bin/nvcc' cmake -S ") and "-DGGML_CUDA=ON" in configure
    assert f"{tmp_path}/cuda-" in configure and "-DGGML_AVX512=ON" in configure
    assert build.endswith("--target llama-server ggml-rpc-server")


def test_dry_run_skips_the_build_when_the_binaries_are_there(monkeypatch, tmp_path, capsys):
    fake_cuda_machine(monkeypatch, tmp_path)
    *_, house, _, _ = lw.plan("cpu")
    (house / "bin").mkdir(parents=True)
    for name in lw.BINARIES:
        (house / "bin" / name).write_bytes(b"")
    monkeypatch.setattr(lw, "_reachable", lambda url: False)  # test double: offline
    assert lw.main(["--venv", "venv", "--backend", "cpu", "--dry-run"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines()[0].endswith("(built)") and len(out.out.splitlines()) == 1, out.out
    assert "warning" not in out.err, "an explicit cpu build is not warned about"


def test_cublas_from_nvidias_wheel_when_the_toolkit_has_none(tmp_path, monkeypatch):
    """A toolkit assembled from NVIDIA's pip wheels (nvcc and the runtime, as on
    a lent GPU machine) may lack cuBLAS and libcuda: cuBLAS comes from the
    nvidia-cublas wheel on the Python path, libcuda from the driver, each
    through links the build's RPATH names; nothing is written before the build."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    toolkit, site, driver, shim = tmp_path / "cuda", tmp_path / "site", tmp_path / "driver", tmp_path / "shim"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "lib").mkdir()
    (toolkit / "lib" / "libcudart.so").write_bytes(b"")
    (site / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "include").mkdir()
    (site / "nvidia" / "cu13" / "include" / "cublas_v2.h").write_text("")
    for name in ("libcublas.so.13", "libcublasLt.so.13"):
        (site / "nvidia" / "cu13" / "lib" / name).write_bytes(b"")
    monkeypatch.setattr(lf, "toolkit_roots", lambda nvcc: [toolkit])
    args, links, missing = lf.cuda_library_args(str(toolkit / "bin" / "nvcc"), shim, [str(site)], driver_dirs=[])
    assert missing == [] and not shim.exists(), "a plan writes nothing"
    assert f"-DCUDA_cublas_LIBRARY={shim}/lib/libcublas.so" in args
    assert f"-DCUDA_cublasLt_LIBRARY={shim}/lib/libcublasLt.so" in args
    assert f"-DCMAKE_CUDA_FLAGS=-isystem {site}/nvidia/cu13/include" in args
    assert "-DGGML_CUDA_NO_VMM=ON" in args, "no libcuda anywhere: no virtual-memory pool"
    assert args[-1] == f"-DCMAKE_BUILD_RPATH={shim}/lib"
    assert links[shim / "lib" / "libcublas.so.13"] == site / "nvidia" / "cu13" / "lib" / "libcublas.so.13"
    driver.mkdir()
    (driver / "libcuda.so.1").write_bytes(b"")
    args, links, _ = lf.cuda_library_args("nvcc", shim, [str(site)], driver_dirs=[str(driver)])
    assert f"-DCUDA_cuda_driver_LIBRARY={shim}/lib/libcuda.so" in args and "-DGGML_CUDA_NO_VMM=ON" not in args
    assert links[shim / "lib" / "libcuda.so"] == driver / "libcuda.so.1"
    lw.make_links(links)
    assert (shim / "lib" / "libcuda.so").resolve() == (driver / "libcuda.so.1").resolve()
    # A full toolkit needs nothing of this.
    for name in ("libcublas.so", "libcublasLt.so", "libcuda.so"):
        (toolkit / "lib" / name).write_bytes(b"")
    assert lf.cuda_library_args("nvcc", shim, [str(site)], driver_dirs=[]) == ([], {}, [])
    # Nowhere at all: said, and CMake says the rest.
    (toolkit / "lib" / "libcublas.so").unlink()
    assert lf.cuda_library_args("nvcc", shim, [], driver_dirs=[])[2] == ["libcublas.so"]
