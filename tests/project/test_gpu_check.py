"""The GPU check without a GPU: bench/gpu_check.sh --dry-run, the pack it
carries (scripts/gpu_pack.py, gpu_wheels.py, llama_trim.py) and the models it writes (bench/gpu_models.py).

The dry run runs every step of the check that needs no GPU: it makes the pack
from the wheel cache (never the network) and checks it, installs its wheels
for the GPU machine's CPython 3.12, writes both models at a small size and
runs them in this machine's llama.cpp, prints the CUDA build and the check's
parts, and collects the tests marked gpu. The pack's own check is then tried
on broken copies of that pack: each must be refused with its reason.
"""

import dataclasses
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import gguf
import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from bench import gpu_models
from scripts import gpu_pack as gp
from scripts import gpu_wheels, llama_trim
from testbed.requirements import need

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
#: The dry run takes about a minute and a half on 2 idle cores (more when they are busy); the
#: first test to use it waits for it.
pytestmark = pytest.mark.timeout(900)


def run_script(*args, timeout=60, cwd=ROOT):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable})


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """(the dry run's completed process, its pack folder), run once for the module."""
    need("gpu-wheels", "the dry run makes the GPU pack from the wheel cache")
    pack = tmp_path_factory.mktemp("gpu") / "pack"
    work = ROOT / ".gpu-work"
    existed = work.exists()
    out = run_script("--dry-run", "--pack", str(pack), timeout=840)
    print(out.stdout[-6000:], out.stderr[-3000:])
    assert existed or not work.exists(), "the dry run writes nothing into the checkout"
    return out, pack


def figures(stdout):
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line and not line.startswith(("#", " ")))


def test_the_dry_run_passes_every_step_that_needs_no_gpu(dry_run):
    out, pack = dry_run
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    got = figures(out.stdout)
    assert got["dry_run_ok"] == "yes"
    ok, size = got["dry_gpu_pack_ok"].split(" bytes=")
    assert ok == "yes" and int(size) < gp.PACK_LIMIT_BYTES
    manifest = (pack / gp.MANIFEST).read_text()
    wheels = sorted(p.name for p in (pack / gp.WHEELS).glob("*.whl"))
    assert int(got["dry_wheels_installed"]) == len(wheels), "every wheel installed for CPython 3.12 x86-64"
    assert int(got["dry_llama_files"]) > 500 and "llama.cpp.tar.gz" in manifest
    assert got["dry_model_big"].startswith("llama3-8b-random-small Q8_0")
    assert got["dry_model_small"].startswith("smollm2-135m-random-small F16")
    # The set-up always builds llama-server, so the dry run runs both models (it says "skipped" without one);
    # each runs to max_tokens (random weights: no end token comes first).
    assert "dry_models_run" not in got, got["dry_models_run"]
    assert got["dry_models_run_big"] == got["dry_models_run_small"] == "32/32"
    # The CUDA build, for the GPU that nvidia-smi names (here none), RPC on, only the two binaries.
    configure = next(line for line in out.stdout.splitlines() if " cmake -S " in line)
    assert "-DGGML_CUDA=ON" in configure and "-DGGML_RPC=ON" in configure and "-DCMAKE_CUDA_ARCHITECTURES=" in configure
    assert "-DCMAKE_CUDA_ARCHITECTURES=all" not in configure and "/src/llama.cpp -B " in configure
    if shutil.which("ninja"):
        assert " -G Ninja " in configure
    assert any(line.endswith("--target llama-server ggml-rpc-server") for line in out.stdout.splitlines())
    parts = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("part ")]
    assert parts == ["machine", "caps", "concurrency", "split", "train", "dp"]
    tests = [v for k, v in (line.split("=", 1) for line in out.stdout.splitlines() if line.startswith("dry_gpu_test="))]
    assert len(tests) >= 2 and all(t.startswith("tests/project/test_gpu_real.py::") for t in tests)


def test_the_pack_carries_every_runtime_dependency_the_image_lacks(dry_run):
    """Counted here from pyproject and the image's package list alone, not by the pack's code."""
    _, pack = dry_run
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    image = {canonicalize_name(line.split("#")[0].strip())
             for line in gpu_wheels.IMAGE_PACKAGES.read_text().splitlines() if line.split("#")[0].strip()}
    lacking = {canonicalize_name(Requirement(d).name) for d in deps} - image
    assert {"rns", "lxmf", "blake3", "tomlkit", "gguf"} <= lacking and "msgpack" not in lacking
    carried = {canonicalize_name(p.name.split("-")[0]) for p in (pack / gp.WHEELS).glob("*.whl")}
    assert lacking <= carried, f"no wheel of {lacking - carried}"
    assert {"cryptography", "pyserial"} <= carried, "and what rns needs in turn"
    assert "reticulum-grid" in carried, "and the project itself"
    assert not carried & image, "nothing the image already has"
    assert sum(p.stat().st_size for p in pack.rglob("*") if p.is_file()) < 60 * 2**20


def broken(pack, tmp_path):
    copy = tmp_path / "pack"
    shutil.copytree(pack, copy)
    return copy


def test_a_pack_without_a_wheel_is_refused_with_its_name(dry_run, tmp_path):
    _, pack = dry_run
    copy = broken(pack, tmp_path / "a")
    next((copy / gp.WHEELS).glob("cffi-*.whl")).unlink()  # needed by cryptography, which rns needs
    problems = gp.check_pack(copy)
    assert any(p.startswith("no wheel of cffi") and "(needed by cryptography)" in p for p in problems), problems
    copy = broken(pack, tmp_path / "b")
    next((copy / gp.WHEELS).glob("rns-*.whl")).unlink()
    problems = gp.check_pack(copy)
    assert "no wheel of rns==0.9.4 (a runtime dependency) and the image lacks it" in problems
    assert any(p.startswith("wheels/rns-") and p.endswith(" is missing") for p in problems), problems
    cli = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_pack.py"), "--check", str(copy)],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 1 and "gpu_pack_ok=no" in cli.stdout and "no wheel of rns==0.9.4" in cli.stderr


def test_a_pack_with_a_changed_a_foreign_or_a_second_wheel_is_refused(dry_run, tmp_path):
    _, pack = dry_run
    copy = broken(pack, tmp_path)
    blake3 = next((copy / gp.WHEELS).glob("blake3-*.whl"))
    shutil.copy(blake3, copy / gp.WHEELS / "blake3-1.0.11-cp311-cp311-manylinux_2_17_x86_64.whl")
    with open(copy / gp.LLAMA_TAR, "ab") as f:
        f.write(b"\0")
    problems = gp.check_pack(copy)
    assert "wheels/blake3-1.0.11-cp311-cp311-manylinux_2_17_x86_64.whl does not install on CPython 3.12 " \
           "manylinux x86-64" in problems
    assert f"{gp.LLAMA_TAR} does not match its SHA-256 in the manifest" in problems


def test_a_pack_over_the_size_limit_is_refused(dry_run, tmp_path, monkeypatch):
    _, pack = dry_run
    monkeypatch.setattr(gp, "PACK_LIMIT_BYTES", 1 << 20)
    assert any(p.startswith("the pack is ") and p.endswith("the limit 1 MiB") for p in gp.check_pack(pack))


def test_a_dependency_the_image_has_needs_no_wheel():
    """needed(): markers for CPython 3.12 on Linux, extras left out, the image's packages skipped."""
    reqs = {"a": [Requirement("b>=1"), Requirement("c; python_version < '3.12'"), Requirement("d; extra == 'x'")],
            "b": [Requirement("numpy>=1"), Requirement("e; platform_system == 'Linux'")]}
    got = gpu_wheels.needed([Requirement("a==1"), Requirement("msgpack>=1")], {"numpy", "msgpack"},
                            lambda n: reqs.get(n, []))
    assert [(name, parent) for name, _, parent in got] == [("a", "project"), ("b", "a"), ("e", "b")]


@pytest.mark.parametrize("rel, kept", [
    ("CMakeLists.txt", True), ("tools/server/server.cpp", True), ("tools/rpc/rpc-server.cpp", True),
    ("tools/mtmd/debug/mtmd-debug.cpp", True), ("tools/ui/CMakeLists.txt", True), ("tools/ui/ui.cpp.in", True),
    ("tools/ui/src/lib/app.svelte", False), ("tools/ui/package.json", False), ("tools/server/tests/unit/a.py", False),
    ("tools/mtmd/test-1.jpeg", False), ("tools/server/README.md", False), ("docs/build.md", False),
    ("models/ggml-vocab-llama-bpe.gguf", False), ("tests/test-backend-ops.cpp", False),
    ("ggml/src/ggml-cuda/template-instances/mmq-instance-q8_0.cu", True), ("ggml/src/ggml-cuda/CMakeLists.txt", True),
    ("ggml/src/ggml-rpc/ggml-rpc.cpp", True), ("ggml/src/ggml-alloc.c", True), ("ggml/src/ggml-cpu/ggml-cpu.c", True),
    ("ggml/src/ggml-vulkan/ggml-vulkan.cpp", False), ("ggml/src/ggml-metal/ggml-metal.m", False),
    ("vendor/cpp-httplib/httplib.cpp", True), ("scripts/ui-assets.cmake", True), ("scripts/sync-ggml.sh", False),
    ("gguf-py/gguf/gguf.py", False), ("convert_hf_to_gguf.py", False), ("cmake/build-info.cmake", True),
])
def test_the_trim_keeps_what_the_build_reads(rel, kept):
    assert llama_trim.keep_llama(rel) is kept


def test_the_big_model_has_llama3_8b_dimensions():
    """The full-size layout, counted without writing it: Llama-3-8B's 8,030,261,248 weights, 8.5 GB in Q8_0."""
    layout = gpu_models.tensors(gpu_models.LLAMA3_8B)
    assert sum(rows * columns for _, rows, columns, _ in layout) == 8_030_261_248
    q8 = sum(rows * columns // 32 * 34 for _, rows, columns, norm in layout if not norm)
    assert 8.4e9 < q8 < 8.6e9 and len(layout) == 2 + 9 * 32 + 1


def test_written_models_load_with_the_tokenizer_and_zero_end_rows(tmp_path):
    """A small model of the 8B layout: the padded vocabulary, the end tokens' output rows at zero, Q8_0."""
    fields = {"tokenizer.ggml.tokens": (["<|endoftext|>", "a", "b", "<|im_end|>"], gguf.GGUFValueType.ARRAY,
                                        gguf.GGUFValueType.STRING),
              "tokenizer.ggml.token_type": ([3, 1, 1, 3], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32),
              "tokenizer.ggml.model": ("gpt2", gguf.GGUFValueType.STRING, None),
              "tokenizer.ggml.eos_token_id": (3, gguf.GGUFValueType.UINT32, None)}
    shape = dataclasses.replace(gpu_models.small(gpu_models.LLAMA3_8B), vocab=100)
    info = gpu_models.write_model(tmp_path / "m.gguf", shape, fields, gpu_models.Q8_0, seed=5)
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == 100 and tokens[:4] == ["<|endoftext|>", "a", "b", "<|im_end|>"] and tokens[4] == "<pad_0>"
    assert info["zeroed_rows"] == 2 and info["tensors"] == len(reader.tensors) == 21
    output = next(t for t in reader.tensors if t.name == "output.weight")
    assert output.tensor_type == gguf.GGMLQuantizationType.Q8_0 and list(output.shape) == [256, 100]
    rows = np.asarray(output.data).reshape(100, -1)
    assert not rows[[0, 3]].any() and all(rows[i].any() for i in (1, 2, 4, 99))
    assert len({rows[i].tobytes() for i in range(1, 100) if i != 3}) == 98, "rows differ"
    blocks = rows[1].reshape(-1, 34)
    scales = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    assert np.allclose(scales, 1 / np.sqrt(256) / 73.6, rtol=1e-3)


def test_unknown_arguments_and_a_missing_pack_are_refused(tmp_path):
    for args in (["--fast"], ["--pack"], [], ["--budget", "soon", "--pack", "x"]):
        out = run_script(*args)
        assert out.returncode == 2 and "usage:" in out.stderr, (args, out.stderr)
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run_script("--pack", str(empty))
    assert out.returncode == 2 and "holds no manifest.json: run make gpu-pack first" in out.stderr


def test_help_describes_both_modes():
    out = run_script("--help")
    assert out.returncode == 0 and "--pack DIR" in out.stdout and "--dry-run" in out.stdout


def test_a_gguf_file_stands_in_for_the_bundled_model(tmp_path, monkeypatch):
    from reticulum_grid.inference import default_model
    model = tmp_path / "stand-in.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setenv(default_model.OVERRIDE_ENV, str(model))
    assert default_model.default_model_path() == str(model.resolve())
    monkeypatch.setenv(default_model.OVERRIDE_ENV, str(tmp_path / "absent.gguf"))
    with pytest.raises(default_model.DefaultModelMissing, match="is not a file"):
        default_model.default_model_path()


def test_an_adapter_of_a_checkpoint_base_names_its_architecture(tmp_path):
    """The training parts train a transformers checkpoint folder: its GGUF LoRA
    takes the architecture and layer count from config.json."""
    from reticulum_grid.store.gguf_info import LoraError
    from reticulum_grid.training.gguf_lora import base_architecture
    (tmp_path / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 30}')
    assert base_architecture(tmp_path) == ("llama", 30)
    (tmp_path / "config.json").write_text('{"model_type": "no-such-arch", "num_hidden_layers": 2}')
    with pytest.raises(LoraError, match="no architecture 'no-such-arch'"):
        base_architecture(tmp_path)


@pytest.mark.parametrize("need_mib", [200, 2_000, 8_750, 80_000])
def test_the_split_lends_give_the_worker_a_few_layers(need_mib):
    """bench/split.py's lends for a model of ``need_mib``: the coordinator alone
    falls short, both hold it, and the worker gets a few of 32 layers."""
    import math

    from bench.split_models import WORKER_SHARE
    from reticulum_grid.split.plan import Offer, plan
    coord, worker = need_mib, math.ceil(need_mib * WORKER_SHARE)
    placement = plan([Offer("coord", lend_mib=coord, has_model=True), Offer("worker", lend_mib=worker)], need_mib, 32)
    assert placement.towers == ["worker", "coord"]
    assert 2 <= placement.workers[0].layers <= 5 and placement.workers[0].first == 0


def _needs_every_tower(lends, need_mib, n_layers):
    """The plan over towers lending ``lends`` (the coordinator's first, it holds
    the GGUF): it takes them all, and without the last worker none fits."""
    from reticulum_grid.split.plan import Offer, PlanError, plan
    offers = [Offer("coord", lend_mib=lends[0], has_model=True)]
    offers += [Offer(f"worker{i}", lend_mib=mib) for i, mib in enumerate(lends[1:])]
    placement = plan(offers, need_mib, n_layers)
    assert placement.towers[-1] == "coord" and len(placement.parts) == len(lends)
    with pytest.raises(PlanError):
        plan(offers[:-1], need_mib, n_layers)
    return placement


@pytest.mark.parametrize("need_mib", [200, 2_000, 8_750, 80_000])
def test_the_three_tower_lends_need_every_tower(need_mib):
    """bench/split.py --towers 3 with --model: no two towers hold the model, all
    three do, and each worker gets a few of 32 layers."""
    from bench.split_models import lends_for
    placement = _needs_every_tower(lends_for(need_mib, 3), need_mib, 32)
    assert all(2 <= w.layers <= 5 for w in placement.workers)


@pytest.mark.parametrize("towers", [2, 3])
def test_the_bundled_model_lends_need_every_tower(towers, model_path):
    """bench/split.py's lends of the bundled model, against its need as the towers estimate it."""
    from bench.split_models import default_lends
    from reticulum_grid.store import gguf_info
    need = gguf_info.need_mib(model_path, 4096, Path(model_path).stat().st_size)
    _needs_every_tower(default_lends(False, towers), need, gguf_info.architecture(model_path)[1])
