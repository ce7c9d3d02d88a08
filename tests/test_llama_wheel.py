"""scripts/llama_wheel.py: backend choice, build flags, torch choice and the dry run.

Unit tests of the set-up script; the machine it inspects (nvcc, nvidia-smi,
platform) is replaced per test by named fakes, and nothing is built or installed.
"""

import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("llama_wheel", ROOT / "scripts" / "llama_wheel.py")
lw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lw)


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
    assert lw.choose_backend(override, system, machine, nvcc, gpus) == expected


def test_unknown_override_is_refused():
    with pytest.raises(ValueError, match="LLAMA_BACKEND must be one of cuda, metal, cpu, not 'rocm'"):
        lw.choose_backend("rocm", "Linux", "x86_64", None, 0)


def test_gpu_without_toolkit_warns_with_the_fix():
    warning = lw.missing_toolkit_warning("cpu", "", None, 2)
    assert "2 NVIDIA GPU(s)" in warning and "make llama LLAMA_BACKEND=cuda" in warning
    assert lw.missing_toolkit_warning("cpu", "cpu", None, 2) is None, "an explicit cpu build is a choice"
    assert lw.missing_toolkit_warning("cpu", "", None, 0) is None
    assert lw.missing_toolkit_warning("cuda", "", "/usr/bin/nvcc", 1) is None


@pytest.mark.parametrize("caps, expected", [
    (["9.0"], "90"),
    (["8.6", "8.9", "8.6"], "86;89"),
    (["12.0", "8.9"], "89;120"),
    ([], "native"),
    (["[N/A]"], "native"),
])
def test_cuda_architectures_from_compute_caps(caps, expected):
    assert lw.cuda_architectures(caps) == expected


def test_cmake_args_keep_rpc_on_for_every_backend():
    assert lw.cmake_args("cpu") == ["-DGGML_RPC=on"]
    assert lw.cmake_args("metal") == ["-DGGML_RPC=on", "-DGGML_METAL=on"]
    assert lw.cmake_args("cuda", "90") == ["-DGGML_RPC=on", "-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=90"]


def test_wheelhouse_is_keyed_by_version_and_flags(tmp_path):
    a = lw.wheelhouse("cuda", "0.3.36", lw.cmake_args("cuda", "90"), cache=tmp_path)
    assert a == lw.wheelhouse("cuda", "0.3.36", lw.cmake_args("cuda", "90"), cache=tmp_path)
    assert a.parent == tmp_path and a.name.startswith("cuda-")
    assert a != lw.wheelhouse("cuda", "0.3.36", lw.cmake_args("cuda", "89"), cache=tmp_path), "another GPU"
    assert a != lw.wheelhouse("cuda", "0.3.37", lw.cmake_args("cuda", "90"), cache=tmp_path)


def test_build_command_points_cmake_at_nvcc(tmp_path):
    build, install = lw.commands("pip", "cuda", "0.3.36", lw.cmake_args("cuda", "90"), tmp_path, "/opt/cuda/bin/nvcc")
    argv, env = build
    assert env["CUDACXX"] == "/opt/cuda/bin/nvcc" and "-DCMAKE_CUDA_ARCHITECTURES=90" in env["CMAKE_ARGS"]
    assert "--no-cache-dir" in argv and argv[-1] == "llama-cpp-python==0.3.36"
    assert install[0][-1] == "llama-cpp-python==0.3.36" and "--no-index" in install[0]
    assert "CUDACXX" not in lw.commands("pip", "cpu", "0.3.36", ["-DGGML_RPC=on"], tmp_path, "/x/nvcc")[0][1]


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


def test_missing_libs():
    assert lw.missing_libs("cuda", {"libggml-rpc.so", "libllama.so"}) == ["ggml-cuda"]
    assert lw.missing_libs("cuda", {"libggml-rpc.so", "libggml-cuda.so"}) == []
    assert lw.missing_libs("cpu", {"libllama.so"}) == ["ggml-rpc"]


def test_pinned_version_comes_from_pyproject(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["rns==0.9.4", "llama-cpp-python==9.8.7", "msgpack>=1.0"]\n')
    assert lw.pinned_version(pyproject) == "9.8.7"
    pyproject.write_text('[project]\ndependencies = ["llama-cpp-python>=0.3"]\n')
    with pytest.raises(SystemExit, match="does not pin"):
        lw.pinned_version(pyproject)
    assert f"llama-cpp-python=={lw.pinned_version()}" in (ROOT / "pyproject.toml").read_text()


def fake_cuda_machine(monkeypatch, tmp_path):
    """Test double for a Linux box with two RTX 4090s (compute 8.9) and nvcc; no
    subprocess may run."""
    monkeypatch.setattr(lw, "find_nvcc", lambda: "/opt/cuda/bin/nvcc")
    monkeypatch.setattr(lw, "nvidia_gpu_count", lambda: 2)
    monkeypatch.setattr(lw, "local_compute_caps", lambda: ["8.9", "8.9"])
    monkeypatch.setattr(lw.platform, "system", lambda: "Linux")
    monkeypatch.setattr(lw.platform, "machine", lambda: "x86_64")
    monkeypatch.setenv("RNGRID_WHEELS", str(tmp_path))
    monkeypatch.delenv("LLAMA_BACKEND", raising=False)

    def no_run(*args, **kwargs):
        raise AssertionError(f"dry run ran {args}")

    monkeypatch.setattr(subprocess, "run", no_run)


def test_dry_run_prints_the_cuda_build_for_the_local_architecture(monkeypatch, tmp_path, capsys):
    fake_cuda_machine(monkeypatch, tmp_path)
    assert lw.main(["--pip", "venv/bin/pip", "--torch", "torch==2.13.0", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("llama.cpp backend: cuda (CMAKE_ARGS=-DGGML_RPC=on -DGGML_CUDA=on "
                               "-DCMAKE_CUDA_ARCHITECTURES=89)")
    torch, build, install = lines[1:]
    assert torch == "venv/bin/pip install torch==2.13.0", "a CUDA tower takes PyPI's CUDA torch"
    assert "CMAKE_ARGS='-DGGML_RPC=on -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=89'" in build
    assert "CUDACXX='/opt/cuda/bin/nvcc'" in build and "venv/bin/pip wheel" in build
    assert install.startswith("venv/bin/pip install --no-deps --force-reinstall --no-index --find-links "
                              f"{tmp_path}/cuda-")


def test_dry_run_skips_the_build_when_the_wheel_is_there(monkeypatch, tmp_path, capsys):
    fake_cuda_machine(monkeypatch, tmp_path)
    *_, house, _, _ = lw.plan("cpu")
    house.mkdir(parents=True)
    (house / "llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    monkeypatch.setattr(lw, "_reachable", lambda url: False)  # test double: offline
    assert lw.main(["--pip", "pip", "--backend", "cpu", "--dry-run"]) == 0
    out = capsys.readouterr()
    assert [line.split()[1] for line in out.out.splitlines()[1:]] == ["install"]
    assert "warning" not in out.err, "an explicit cpu build is not warned about"
