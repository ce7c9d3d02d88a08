"""Expert placement and tensor plans on paper (split/experts.py, split/tensor.py)
and the runner command line they make: pure functions, no network."""

import pytest

from reticulum_grid.inference.runner_spec import RunnerSpec
from reticulum_grid.split import experts, tensor
from reticulum_grid.split.plan import Offer, PlanError, plan
from reticulum_grid.split.supervisor import SplitModel

GB = 1024


def offer(name, gib, **extra):
    return Offer(name, name.encode().ljust(16, b"\0"), int(gib * GB), **extra)


def test_experts_go_to_the_fewest_workers_and_the_rest_to_a_coordinator_holding_the_gguf():
    # A 60 GB MoE model, 48 GB of it experts: 12 GB (+10%) on the coordinator, 48 GB (+10%) on workers.
    towers = [offer("holder", 16, has_model=True), offer("big", 64), offer("w1", 32), offer("w2", 32)]
    placed = experts.plan_experts(towers, 60 * GB, 48, 48 * GB)
    assert placed.strategy == "experts" and placed.coordinator.offer.name == "holder"
    assert [p.offer.name for p in placed.workers] == ["big"]  # one worker beats two
    assert placed.coordinator.mib == 12 * GB and placed.workers[0].mib == 48 * GB
    assert experts.expert_layers([p.layers for p in placed.parts], 1) == [(0, 48)]
    assert any("experts of layers 0-47" in r for r in placed.reasons)


def test_expert_shares_follow_lent_memory():
    towers = [offer("coord", 16, has_model=True), offer("a", 30), offer("b", 10)]
    placed = experts.plan_experts(towers, 44 * GB, 40, 36 * GB)
    held = experts.expert_layers([p.layers for p in placed.parts], len(placed.workers))
    assert [p.offer.name for p in placed.workers] == ["a", "b"]
    assert held[0][0] == 0 and abs(held[0][1] - 30) <= 1 and held[1][1] == 40  # 3:1 (the lent memory's), to a layer
    assert sum(p.mib for p in placed.workers) == pytest.approx(36 * GB, abs=2)


def test_expert_placement_refuses_a_dense_model_and_says_what_is_missing():
    with pytest.raises(PlanError, match="no expert tensors"):
        experts.plan_experts([offer("a", 64), offer("b", 64)], 10 * GB, 30, 0)
    with pytest.raises(PlanError, match="coordinator lending ~"):  # the rest fits no tower
        experts.plan_experts([offer("a", 8), offer("b", 64)], 80 * GB, 40, 60 * GB)


def test_a_tensor_plan_takes_the_pipelines_towers_with_shares_by_lent_memory():
    towers = [offer("g5090", 32, has_model=True), offer("g3090", 16), offer("laptop", 8)]
    placed = tensor.plan_tensor(towers, 40 * GB, 48)
    assert placed.strategy == "tensor" and placed.to_map()["strategy"] == "tensor"
    assert placed.towers == plan(towers, 40 * GB, 48).towers == ["g3090", "g5090"]
    assert [p.layers for p in placed.parts] == [16, 32]
    assert "tensor parallel" in placed.reasons[1]


def test_tensor_devices_name_the_rpc_servers_in_order_then_the_gpu():
    assert tensor.devices(["127.0.0.1:1", "127.0.0.1:2"], "") == ("RPC0", "RPC1")
    assert tensor.devices(["127.0.0.1:1"], "CUDA0") == ("RPC0", "CUDA0")


def test_a_tensor_split_runner_names_its_devices_after_the_rpc_servers(tmp_path):
    model = SplitModel("k", tmp_path / "m.gguf", 512, ["127.0.0.1:5", "127.0.0.1:6"], [1, 3], tmp_path / "log",
                       strategy="tensor")
    argv = model.spec.argv(8080)
    assert argv[argv.index("-sm") + 1] == "tensor" and argv[argv.index("-ts") + 1] == "1,3"
    assert argv.index("--rpc") < argv.index("-dev") and argv[argv.index("-dev") + 1] == "RPC0,RPC1"
    assert "-sm" not in RunnerSpec("m.gguf").argv(8080)


def test_llama_cpps_refusal_is_read_back_with_the_architecture():
    line = "E llama_model_load: error loading model: LLAMA_SPLIT_MODE_TENSOR not implemented for architecture 'olmoe'"
    assert tensor.refused_architecture("noise\n" + line + "\n") == "olmoe"
    assert tensor.refused_architecture("error loading model: unknown model architecture: 'x'") is None
