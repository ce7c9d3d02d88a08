#!/usr/bin/env bash
# The GPU check, in one command of at most ~10 minutes, on a machine with an
# NVIDIA GPU, its driver, the CUDA toolkit (nvcc), CMake, ninja and a python3
# with torch, transformers and peft, and no network at all: everything else
# comes in the pack that `make gpu-pack` writes (.gpu-pack/: the trimmed
# llama.cpp source, wheels of the Python packages that machine lacks, the
# project's own wheel, the bundled model's tokenizer).
#
#   bench/gpu_check.sh --pack DIR [--out DIR] [--work DIR] [--budget S]
#       1. checks the pack and installs its wheels into WORK/site (no index);
#       2. builds llama-server and ggml-rpc-server for CUDA, for this GPU's
#          architecture only (nvidia-smi), all cores, ninja
#          (scripts/llama_build.py), while bench/gpu_models.py writes the
#          models: random weights shaped like Llama-3-8B (Q8_0) and like the
#          bundled SmolLM2-135M (F16, and as a transformers checkpoint);
#       3. bench/gpu_check.py: caps, offload, one stream, 1/4/8 concurrent
#          streams, a split over two towers through the RNS tunnel, LoRA
#          steps on the GPU and the CPU, two data-parallel ranks;
#       4. the tests marked gpu (tests/project/test_gpu_real.py), on the small model.
#     Every figure is one key=value line (all of them again at the end);
#     OUT (default gpu-check-out/) gets gpu_check.json, build.log, pytest.log,
#     logs.txt. WORK (default .gpu-work/, ignored by git) keeps the build,
#     the models and the wheels, so a second run on the same machine skips
#     what is done. Exit status 1 when a check failed.
#
#   bench/gpu_check.sh --dry-run [--pack DIR]
#       every step that needs no GPU, here: makes the pack from the wheel
#       cache (never the network; into DIR, else a temporary folder) and
#       checks it, installs its wheels for CPython 3.12 into a temporary
#       folder, writes both models at a small size (llama.cpp here runs
#       them when it is installed), prints the CUDA build it would run and
#       the parts of the check, and collects the gpu tests. Writes nothing
#       outside the temporary folder (and DIR).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYTHON=${PYTHON:-python3}

usage() {
  echo "usage: $0 --pack DIR [--out DIR] [--work DIR] [--budget SECONDS]" >&2
  echo "       $0 --dry-run [--pack DIR]" >&2
  exit 2
}

PACK="" OUTDIR="gpu-check-out" WORK=".gpu-work" BUDGET=570 DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --pack) [ $# -ge 2 ] || usage; PACK=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || usage; OUTDIR=$2; shift 2 ;;
    --work) [ $# -ge 2 ] || usage; WORK=$2; shift 2 ;;
    --budget) [ $# -ge 2 ] && [[ $2 =~ ^[0-9]+$ ]] || usage; BUDGET=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument $1" >&2; usage ;;
  esac
done
STARTED=$(date +%s)
DEADLINE=$((STARTED + BUDGET))
left() { echo $((DEADLINE - $(date +%s))); }
say() { echo "$*"; }

# -- the dry run: every step that needs no GPU ---------------------------------
if [ "$DRY" = 1 ]; then
  TMP=$(mktemp -d "${TMPDIR:-/tmp}/rngrid-gpu-dry.XXXXXX") || exit 1
  trap 'rm -rf "$TMP"' EXIT
  PACKDIR=${PACK:-$TMP/pack}
  rc=0
  "$PYTHON" scripts/gpu_pack.py --out "$PACKDIR" --offline || { echo "gpu_check: the pack could not be made" >&2; exit 1; }
  "$PYTHON" scripts/gpu_pack.py --check "$PACKDIR" | sed 's/^/dry_/' || rc=1
  # The wheels install for the GPU machine's interpreter (CPython 3.12, manylinux x86-64), from the pack alone.
  platforms=()
  for n in $(seq 39 -1 17); do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
  if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$TMP/site" --python-version 3.12 \
      --implementation cp --only-binary=:all: "${platforms[@]}" --platform manylinux2014_x86_64 \
      "$PACKDIR"/wheels/*.whl; then
    say "dry_wheels_installed=$(ls -d "$TMP"/site/*.dist-info | wc -l)"
  else
    say "dry_wheels_installed=failed"; rc=1
  fi
  mkdir -p "$TMP/src" && tar -xzf "$PACKDIR/llama.cpp.tar.gz" -C "$TMP/src" || rc=1
  say "dry_llama_files=$(find "$TMP/src/llama.cpp" -type f | wc -l)"
  checkpoint=()
  "$PYTHON" -c "import torch, transformers" 2>/dev/null && checkpoint=(--checkpoint)
  "$PYTHON" -m bench.gpu_models --tokenizer "$PACKDIR/tokenizer.gguf" --out "$TMP/models" --small \
      "${checkpoint[@]}" --json "$TMP/models.json" 2>"$TMP/models.err" | sed 's/^/dry_/' \
      || { rc=1; tail -n 20 "$TMP/models.err"; }
  "$PYTHON" - "$TMP/models.json" <<'EOF' || rc=1
import json, sys
from pathlib import Path
from reticulum_grid.node import engine
if not engine.available(engine.SERVER):
    print("dry_models_run=skipped (no llama-server here)")
    raise SystemExit(0)
from reticulum_grid.inference.runner import Runner, RunnerSpec
for role, info in json.loads(Path(sys.argv[1]).read_text()).items():
    if not info["path"].endswith(".gguf"):
        continue
    runner = Runner(RunnerSpec(info["path"], n_ctx=256, parallel=1, threads=2), Path(info["path"] + ".log")).start()
    try:
        done = [e.get("tokens_predicted") for e in runner.stream("/completion", {
            "prompt": "Count: 1, 2, 3,", "n_predict": 32, "temperature": 0.0}) if e.get("stop")]
    finally:
        runner.close()
    print(f"dry_models_run_{role}={done[-1] if done else 0}/32")
EOF
  say "# the CUDA build it would run (this GPU's architecture from nvidia-smi; here there is none):"
  RNGRID_LLAMA_CACHE="$TMP/llama" "$PYTHON" scripts/llama_build.py --venv "$TMP/env" --backend cuda \
      --source "$TMP/src/llama.cpp" --dry-run || rc=1
  say "# the check's parts:"
  "$PYTHON" -m bench.gpu_check --dry-run --budget "$BUDGET" || rc=1
  if grep -q '"gpu: ' pyproject.toml; then
    say "# the tests marked gpu:"
    "$PYTHON" -m pytest -m gpu --collect-only -q -p no:cacheprovider tests/project/test_gpu_real.py 2>/dev/null \
        | grep '::' | sed 's/^/dry_gpu_test=/' || rc=1
  fi
  say "dry_run_ok=$([ $rc = 0 ] && echo yes || echo no)"
  exit $rc
fi

# -- the real run -------------------------------------------------------------
[ -n "$PACK" ] || usage
[ -f "$PACK/manifest.json" ] || { echo "gpu_check: $PACK holds no manifest.json: run make gpu-pack first" >&2; exit 2; }
command -v nvidia-smi >/dev/null || { echo "gpu_check: no nvidia-smi: this needs an NVIDIA GPU and its driver" >&2; exit 2; }
mkdir -p "$OUTDIR" "$WORK" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd) WORK=$(cd "$WORK" && pwd) PACK=$(cd "$PACK" && pwd)
failures=0

"$PYTHON" scripts/gpu_pack.py --check "$PACK" || { echo "gpu_check: the pack is not complete (above)" >&2; exit 2; }
stamp=$(sha256sum "$PACK/manifest.json" | cut -c1-16)
if [ ! -f "$WORK/site/.from-$stamp" ]; then
  rm -rf "$WORK/site"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" \
      "$PACK"/wheels/*.whl || { echo "gpu_check: the wheels did not install" >&2; exit 2; }
  touch "$WORK/site/.from-$stamp"
fi
export PYTHONPATH="$ROOT:$WORK/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
say "wheels_s=$(( $(date +%s) - STARTED ))"

# The models, written while llama.cpp builds (the build takes the cores, the writing the disk).
if [ ! -f "$WORK/models/done-$stamp" ]; then
  rm -rf "$WORK/models"
  ( "$PYTHON" -m bench.gpu_models --tokenizer "$PACK/tokenizer.gguf" --out "$WORK/models" --checkpoint \
      --json "$WORK/models/models.json" > "$WORK/models.log" 2>&1 && touch "$WORK/models/done-$stamp" ) &
  writer=$!
else
  writer=""
fi

if [ ! -d "$WORK/src-$stamp/llama.cpp" ]; then
  rm -rf "$WORK"/src-*
  mkdir -p "$WORK/src-$stamp" && tar -xzf "$PACK/llama.cpp.tar.gz" -C "$WORK/src-$stamp" || exit 2
fi
nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv,noheader
build_started=$(date +%s)
RNGRID_LLAMA_CACHE="$WORK/llama" timeout $(( $(left) - 150 > 60 ? $(left) - 150 : 60 )) \
    "$PYTHON" scripts/llama_build.py --venv "$WORK/env" --backend cuda --source "$WORK/src-$stamp/llama.cpp" \
    > "$OUTDIR/build.log" 2>&1
build_rc=$?
say "build_s=$(( $(date +%s) - build_started ))"
grep -E '^(llama.cpp backend|installed|warning|linking)' "$OUTDIR/build.log" | cut -c1-400
if [ $build_rc = 0 ]; then
  say "build_ok=yes"
  export RNGRID_LLAMA_BIN="$WORK/env/bin"
else
  say "build_ok=no (exit status $build_rc; the end of build.log follows)"
  tail -n 30 "$OUTDIR/build.log"
  failures=$((failures + 1))
fi

if [ -n "$writer" ]; then wait "$writer"; fi
if [ -f "$WORK/models/models.json" ] && ls "$WORK"/models/done-* >/dev/null 2>&1; then
  grep '^model_' "$WORK/models.log"
  BIG=$(ls "$WORK"/models/llama3-8b-random*.gguf) SMALL=$(ls "$WORK"/models/smollm2-135m-random*.gguf)
  HF=$(ls -d "$WORK"/models/smollm2-135m-random*-hf)
else
  say "models_ok=no"; cat "$WORK/models.log"; exit 1
fi

# The measurements; the tests marked gpu get what is left after them (about a minute).
parts=machine,caps,concurrency,split,train,dp
[ $build_rc = 0 ] || parts=machine,train,dp  # without llama.cpp only training can run
check_budget=$(( $(left) - 60 ))
if [ $check_budget -gt 30 ]; then
  timeout $((check_budget + 20)) "$PYTHON" -m bench.gpu_check --big "$BIG" --small "$SMALL" --hf "$HF" \
      --out "$OUTDIR" --budget "$check_budget" --parts "$parts"
  check_rc=$?
  [ $check_rc = 0 ] || failures=$((failures + 1))
else
  say "gpu_check_skipped=$(left)s_left"
  failures=$((failures + 1))
fi

if grep -q '"gpu: ' pyproject.toml; then
  if [ "$(left)" -gt 40 ]; then
    RNGRID_DEFAULT_MODEL="$SMALL" timeout $(( $(left) - 5 )) "$PYTHON" -m pytest -m gpu -q -p no:cacheprovider \
        tests/project/test_gpu_real.py > "$OUTDIR/pytest.log" 2>&1
    tests_rc=$?
    say "gpu_tests=$(tail -n 3 "$OUTDIR/pytest.log" | grep -E 'passed|failed|skipped|error' | tail -n 1 | tr ' ' '_')"
    [ $tests_rc = 0 ] || { failures=$((failures + 1)); tail -n 40 "$OUTDIR/pytest.log"; }
  else
    say "gpu_tests=skipped_$(left)s_left"
  fi
else
  say "gpu_tests=no_gpu_marker_in_pyproject"
fi

say "total_s=$(( $(date +%s) - STARTED ))"
say "gpu_check_ok=$([ $failures = 0 ] && echo yes || echo no)"
[ $failures = 0 ]
