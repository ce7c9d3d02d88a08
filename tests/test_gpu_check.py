"""bench/gpu_check.sh --dry-run: the commands the GPU check would run, run here
without a GPU (nothing is built, installed or written)."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_dry_run_shows_the_cuda_build_and_the_checks(tmp_path):
    venv, wheels = tmp_path / "venv-cuda", tmp_path / "llama"
    out = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run"], cwd=tmp_path,
                         env={**os.environ, "VENV": str(venv), "PYTHON": sys.executable,
                              "RNGRID_LLAMA_CACHE": str(wheels)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    commands = [shlex.split(line[2:]) for line in lines if line.startswith("+ ")]
    assert [cmd[0] for cmd in commands] == ["nvidia-smi", "make", "env", "env"]
    assert commands[0][1] == "--query-gpu=name,memory.total,compute_cap,driver_version"
    assert commands[1] == ["make", "setup", f"VENV={venv}", "LLAMA_BACKEND=cuda", f"PYTHON={sys.executable}"]
    # the tests marked gpu (tests/test_gpu_real.py), in the CUDA venv
    assert commands[2] == ["env", "PYTHONUNBUFFERED=1", f"{venv}/bin/python", "-m", "pytest", "-m", "gpu", "-q",
                           "-p", "no:cacheprovider"]
    assert commands[3] == ["env", "PYTHONUNBUFFERED=1", f"{venv}/bin/python", "-m", "bench.gpu_check",
                           "--tokens", "256", "--steps", "20"]
    # make's own plan passes the backend to the set-up script ...
    assert any("LLAMA_BACKEND=cuda" in line and "scripts/llama_build.py" in line for line in lines)
    # ... which builds llama-server and the RPC server for CUDA, for the local architecture only
    build = [line for line in lines if " cmake -S " in line]
    assert len(build) == 1 and "-DGGML_CUDA=ON" in build[0] and "-DGGML_RPC=ON" in build[0]
    assert "-DCMAKE_CUDA_ARCHITECTURES=" in build[0] and f"-B {wheels}/cuda-" in build[0]
    assert "-DCMAKE_CUDA_ARCHITECTURES=all" not in build[0]
    assert any(line.endswith("--target llama-server ggml-rpc-server") for line in lines)
    # the checks: a GPU tower, a CPU tower with the GPU hidden, and training on both
    towers = [line for line in lines if " -m reticulum_grid -v tower --config " in line]
    assert len(towers) == 2 and "CUDA_VISIBLE_DEVICES" not in towers[0]
    assert towers[1].lstrip("# ").startswith("CUDA_VISIBLE_DEVICES=''")
    workers = [line for line in lines if "-m reticulum_grid.training.trainer" in line]
    assert len(workers) == 2 and "CUDA_VISIBLE_DEVICES=''" in workers[1] and "job-cuda" in workers[0]
    assert not venv.exists() and not wheels.exists() and not any(tmp_path.iterdir()), "a dry run writes nothing"


def test_unknown_argument_is_refused():
    out = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--fast"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2 and "usage" in out.stderr
