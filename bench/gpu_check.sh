#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU, its driver and the CUDA
# toolkit (nvcc), in one run of at most ~10 minutes:
#   1. torch (CUDA build) and llama.cpp built for this GPU's architecture only
#      (RPC on), into their own venv, so a CPU set-up in .venv stays as it is;
#   2. the tests that need a GPU (pytest -m gpu: tests/test_gpu_real.py):
#      offload accounting on a real tower, fp16 training with its loss scaler,
#      NCCL data parallel (on two GPUs);
#   3. bench/gpu_check.py: a tower must announce backend cuda with the GPU's
#      name and VRAM within 5 % of nvidia-smi and hold the model offloaded;
#      256 streamed tokens (TTFT, tokens/s) and 20 LoRA steps (s/step) on the
#      GPU next to the CPU of the same machine.
# Last line: gpu_vs_cpu_tokens=<GPU tokens/s / CPU tokens/s>; the exit status
# is 1 when a check or a GPU test failed.
#
#   bench/gpu_check.sh            run it (VENV=.venv-cuda PYTHON=python3 by default)
#   bench/gpu_check.sh --dry-run  print the commands it would run and the build
#                                 plan; runs nothing, writes nothing
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-cuda}
PYTHON=${PYTHON:-python3}
DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac

run() {
  printf '+'; printf ' %q' "$@"; printf '\n'
  if [ "$DRY" = 0 ]; then "$@"; fi
}

if [ "$DRY" = 0 ]; then
  command -v nvidia-smi >/dev/null || { echo "gpu_check: no nvidia-smi: this needs an NVIDIA GPU and its driver" >&2; exit 2; }
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || {
    echo "gpu_check: no nvcc: install the CUDA toolkit first" >&2; exit 2; }
fi
started=$(date +%s)
run nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv,noheader

# 1. The CUDA set-up (the llama.cpp build is limited to the local architecture).
run make setup VENV="$VENV" LLAMA_BACKEND=cuda PYTHON="$PYTHON"
if [ "$DRY" = 1 ]; then
  echo "# what make would run, and the llama.cpp build it would do:"
  make -s -n setup VENV="$VENV" LLAMA_BACKEND=cuda PYTHON="$PYTHON" | sed 's/^/#   /'
  "$PYTHON" scripts/llama_build.py --venv "$VENV" --backend cuda --dry-run | sed 's/^/#   /'
fi
echo "set-up: $(( $(date +%s) - started )) s"

# 2. The tests that need a GPU; a failure is reported at the end, after the figures.
tests_rc=0
run env PYTHONUNBUFFERED=1 "$VENV/bin/python" -m pytest -m gpu -q -p no:cacheprovider || tests_rc=$?

# 3. Caps, streaming and training, each on the GPU and on the CPU.
run env PYTHONUNBUFFERED=1 "$VENV/bin/python" -m bench.gpu_check --tokens 256 --steps 20
if [ "$DRY" = 1 ]; then
  echo "# what bench/gpu_check.py would run:"
  "$PYTHON" -m bench.gpu_check --tokens 256 --steps 20 --dry-run | sed 's/^/#   /'
fi
if [ "$tests_rc" != 0 ]; then
  echo "gpu_check: the GPU tests failed (pytest -m gpu exit status $tests_rc)" >&2
  exit 1
fi
