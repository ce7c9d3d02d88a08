"""A split planned on paper (split/simulate.py, split/shapes.py, ``rngrid
route --simulate``): the real planner and estimator on the seed's case, a
70B Q4_K_M over an RTX 5090, an RTX 3090, a laptop and a MacBook, on a LAN
and on a tailnet (docs/examples/seed-70b-*.toml)."""

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from reticulum_grid.split import estimate, shapes, simulate
from reticulum_grid.split.plan import PlanError
from testbed.requirements import needs

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
LAN, TAILNET = EXAMPLES / "seed-70b-lan.toml", EXAMPLES / "seed-70b-tailnet.toml"


def lending(scenario, **lend_mib):
    """``scenario`` with the named towers lending other amounts."""
    offers = tuple(dataclasses.replace(o, lend_mib=lend_mib.get(o.name, o.lend_mib)) for o in scenario.offers)
    return dataclasses.replace(scenario, offers=offers)


def check_placement(scenario, placement):
    """Every layer placed once, in order, and no tower given more than it lends."""
    assert [(p.first, p.end) for p in placement.parts] == list(zip(
        [0] + [p.end for p in placement.parts[:-1]], [p.end for p in placement.parts]))
    assert placement.parts[0].first == 0 and placement.parts[-1].end == scenario.shape.blocks
    assert all(p.mib <= p.offer.lend_mib for p in placement.parts)
    assert sum(p.mib for p in placement.parts) >= placement.need_mib


def test_the_shapes_are_the_published_architectures():
    seventy, eight = shapes.SHAPES["llama-70b-q4_k_m"], shapes.SHAPES["llama-8b-q4_k_m"]
    assert shapes.llama_weights(80, 8192, 28672, 64, 8, 128256) == 70_553_706_496  # Meta's "70B" (70.6e9)
    assert shapes.llama_weights(32, 4096, 14336, 32, 8, 128256) == 8_030_261_248  # bench/gpu_models.py's 8B
    assert seventy.weight_bytes == pytest.approx(43.1e9, rel=0.01)  # llama.cpp's quantize README: 43.1 GB
    assert eight.weight_bytes == pytest.approx(4.9e9, rel=0.01)  # and 4.9 GB
    # 80 layers x 4096 tokens x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 1280 MiB of KV cache, + 128 MiB runtime
    assert seventy.need_mib(4096) == seventy.weight_bytes // (1 << 20) + 1280 + 128


def test_the_seeds_70b_goes_on_the_two_gpus_on_a_lan():
    scenario = simulate.load(LAN)
    placement = simulate.run(scenario)
    check_placement(scenario, placement)
    assert placement.towers == ["rtx3090", "rtx5090"]  # the fewest towers: the laptop and the MacBook stay out
    assert placement.coordinator.offer.name == "rtx5090"
    e = placement.estimate
    assert 0 < e.tokens_per_s < math.inf and 0 < e.added_ttft_s < math.inf
    assert e.link_bytes_per_token == estimate.link_bytes_per_token(8192, estimate.PROMPT_TOKENS)


def test_a_tailnet_costs_tokens_per_second_and_first_token_time():
    lan, tailnet = simulate.run(simulate.load(LAN)), simulate.run(simulate.load(TAILNET))
    assert tailnet.towers == lan.towers
    assert 0 < tailnet.estimate.tokens_per_s < lan.estimate.tokens_per_s
    assert tailnet.estimate.added_ttft_s > lan.estimate.added_ttft_s


def test_the_laptop_is_used_only_when_the_others_cannot_hold_the_model():
    scenario = simulate.load(LAN)
    three = simulate.run(lending(scenario, rtx3090=16000))  # a third tower is needed: the MacBook lends more
    check_placement(scenario, three)
    assert sorted(three.towers) == ["macbook", "rtx3090", "rtx5090"]
    four = lending(scenario, rtx3090=8000)
    everyone = simulate.run(four)
    check_placement(four, everyone)
    assert sorted(everyone.towers) == ["laptop", "macbook", "rtx3090", "rtx5090"]
    assert everyone.estimate.tokens_per_s < three.estimate.tokens_per_s  # the CPU's layers are slow to read
    with pytest.raises(PlanError, match="offer"):
        simulate.run(lending(scenario, rtx3090=4000))


def test_a_gguf_path_is_read_for_its_shape(tmp_path, model_path):
    (tmp_path / "grid.json").write_text(json.dumps({"model": str(model_path), "offers": [
        {"name": "a", "backend": "cpu", "lend_mib": 200}, {"name": "b", "backend": "cpu", "lend_mib": 200,
                                                          "rtt_ms": 2, "rate_mbit_s": 100}]}))
    scenario = simulate.load(tmp_path / "grid.json")
    assert scenario.shape.blocks == 30 and scenario.shape.weight_bytes == Path(model_path).stat().st_size
    placement = simulate.run(scenario)
    check_placement(scenario, placement)
    assert placement.towers == ["b", "a"]  # a, lending as much and nearer (its RTT is 0), coordinates


@pytest.mark.parametrize("text, says", [
    ('model = "llama-70b-q4_k_m"\noffers = []', "offers must be"),
    ('model = "nope"\n[[offers]]\nname = "a"\nlend_mib = 1', "neither a file nor one of llama-70b-q4_k_m"),
    ('model = "llama-70b-q4_k_m"\n[[offers]]\nname = "a"\nlend_mib = 1\nlend = 2', "unknown key(s) 'lend'"),
    ('model = "llama-70b-q4_k_m"\n[[offers]]\nname = "a"\nlend_mib = "lots"', "offer 'a': lend_mib = 'lots'"),
    ('model = "llama-70b-q4_k_m"\n[[offers]]\nname = "a"\nlend_mib = 1\nrtt_ms = -1', "rtt_ms = -1.0"),
    ('model = "llama-70b-q4_k_m"\n[[offers]]\nname = "a"', "offer 'a': lend_mib is missing"),
    ('model = "llama-70b-q4_k_m"\n[[offers]]\nname = "a"\nlend_mib = 1\nbackend = "tpu"', "backend must be"),
    ('model = "llama-70b-q4_k_m"\n[[offers]]\nname = "a"\nlend_mib = 1\n[[offers]]\nname = "a"\nlend_mib = 1',
     "two offers are named 'a'"),
    ('model = [', "grid.toml"),
])
def test_a_bad_file_is_a_clear_error(tmp_path, text, says):
    (tmp_path / "grid.toml").write_text(text)
    with pytest.raises(simulate.SimulationError) as caught:
        simulate.load(tmp_path / "grid.toml")
    assert says in str(caught.value)


def route(*args, home):
    return subprocess.run([sys.executable, "-m", "reticulum_grid", "--home", str(home), "route", *args],
                          capture_output=True, text=True, timeout=120)


def test_rngrid_route_simulate_prints_the_seeds_plan(tmp_path):
    shown = route("--simulate", str(LAN), home=tmp_path)
    assert shown.returncode == 0, shown.stderr
    for words in ("rtx3090", "rtx5090", "0-33", "34-79 + output", "tokens/s", "to the first token",
                  "kB per token", "not a measurement"):
        assert words in shown.stdout
    assert "laptop" not in shown.stdout.split("reasons")[0] and "macbook" not in shown.stdout
    as_json = route("--simulate", str(TAILNET), "--json", home=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    split = json.loads(as_json.stdout)["split"]
    assert split["simulated"] and split["model"]["blocks"] == 80
    assert [(p["tower"], p["first"], p["end"], p["role"]) for p in split["parts"]] == [
        ("rtx3090", 0, 34, "worker"), ("rtx5090", 34, 80, "coordinator")]
    assert split["estimate"] == simulate.run(simulate.load(TAILNET)).estimate.to_map()


def test_rngrid_route_simulate_says_what_does_not_fit(tmp_path):
    (tmp_path / "small.toml").write_text('model = "llama-70b-q4_k_m"\n[[offers]]\nname = "a"\nlend_mib = 1000\n')
    shown = route("--simulate", str(tmp_path / "small.toml"), home=tmp_path)
    assert shown.returncode == 1 and "the 1 towers lending memory offer 1000 MiB" in shown.stderr
    both = route("--simulate", str(LAN), "-m", "x", home=tmp_path)
    assert both.returncode == 1 and "drop -m" in both.stderr


@needs("llama-rpc", "the bytes are llama.cpp's RPC messages")
def test_the_bytes_per_token_are_what_llama_cpps_rpc_sends(tmp_path, model_path):
    """The real llama-server over a real ggml-rpc-server (the bundled model):
    the bytes a generated token moves over the worker's link are the estimate's."""
    from bench.split_link_bytes import measure
    found, one_token = measure(Path(model_path), 24, tmp_path)
    assert found["tokens"] > 0 and found["bytes_per_token"] == found["estimated_bytes_per_token"], one_token
    assert one_token[-1].endswith("graph_recompute")  # the decode graph reused, not sent again
