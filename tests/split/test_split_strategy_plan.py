"""Expert placement and tensor plans on paper (split/experts.py, split/tensor.py)
and the runner command line they make: pure functions, no network."""

import dataclasses

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


# -- picking a strategy (split/strategy.py, client/strategies.py) ----------------------------------

SMOL_BYTES, SMOL_LAYERS, SMOL_WIDTH = 105_000_000, 30, 576


def loopback_costs(rate=2e9, rtt=0.0, backend="cpu", expert_bytes=0, read_bytes=SMOL_BYTES):
    """Two CPU towers that each decode SmolLM2-135M alone at 67.4 tokens/s (issue 32's run), joined by a
    link; with ``expert_bytes``, a token reads a quarter of them."""
    from reticulum_grid.split import strategy
    keys = [offer(n, 1).key for n in ("coord", "worker")]
    return strategy.Costs({k: 67.4 * read_bytes for k in keys}, {keys[1]: rtt}, {keys[1]: rate},
                          {k: backend for k in keys}, read_bytes, expert_bytes, expert_bytes // 4, SMOL_WIDTH)


def two_plans(strategies=("pipeline", "tensor"), expert_mib=0):
    towers = [offer("coord", 0.2, has_model=True), offer("worker", 0.2)]
    place = {"pipeline": lambda: plan(towers, 300, SMOL_LAYERS),
             "tensor": lambda: tensor.plan_tensor(towers, 300, SMOL_LAYERS),
             "experts": lambda: experts.plan_experts(towers, 300, SMOL_LAYERS, expert_mib)}
    return [place[name]() for name in strategies]


def test_the_tensor_estimate_reproduces_the_measured_loopback_run():
    """bench/split.py --strategy tensor through two towers on loopback: one tower decoded at 156.4
    tokens/s, the tensor split at 12.7 with a 0.33 ms RTT and a 60.6 MB/s link, and took a 1k-token
    prompt 0.8 s slower than one tower; the estimate is within 30 % and says slower too."""
    from reticulum_grid.split import strategy
    pipeline, split = two_plans()
    costs = dataclasses.replace(loopback_costs(rate=60.6e6, rtt=0.33e-3),
                                bandwidths={k: 156.4 * SMOL_BYTES for k in loopback_costs().bandwidths})
    assert strategy.cost(split, costs, 25, 64).tokens_per_s == pytest.approx(12.7, rel=0.3)
    whole = dataclasses.replace(split, workers=(), strategy="pipeline",
                                coordinator=dataclasses.replace(split.coordinator, first=0, end=SMOL_LAYERS))
    assert strategy.cost(split, costs, 1000, 0).ttft_s > strategy.cost(whole, costs, 1000, 0).ttft_s


def test_tensor_syncs_cost_the_rpc_round_trip_where_one_was_timed():
    """Once the coordinator timed an RPC round trip to the worker (rpc_rtts), each of a token's
    SYNCS_PER_LAYER syncs a layer costs TENSOR_SYNC_S plus TENSOR_SYNC_ROUND_TRIPS of it, whatever the
    RNS ping says; before, the ping's fallback. Prefill pays the same per batch."""
    from reticulum_grid.split import strategy
    (split,) = two_plans(("tensor",))
    worker = split.workers[0].offer.key
    pinged = loopback_costs(rtt=0.002)
    timed = dataclasses.replace(pinged, rpc_rtts={worker: 0.005})
    syncs = strategy.SYNCS_PER_LAYER * SMOL_LAYERS
    by_ping, by_rpc = strategy.cost(split, pinged, 100, 64), strategy.cost(split, timed, 100, 64)
    per_sync = (strategy.TENSOR_SYNC_S + strategy.TENSOR_SYNC_ROUND_TRIPS * 0.005 - strategy.TENSOR_PING_SYNC_S
                - strategy.TENSOR_PING_ROUND_TRIPS * (0.002 - strategy.PROBE_OVERHEAD_S))
    assert 1 / by_rpc.tokens_per_s - 1 / by_ping.tokens_per_s == pytest.approx(syncs * per_sync)
    assert by_rpc.ttft_s - by_ping.ttft_s == pytest.approx(syncs * per_sync)
    assert strategy.cost(split, dataclasses.replace(timed, rtts={worker: 0.05}), 100, 64) == by_rpc
    # The runs the constants are fitted to, bench/split.py --strategy tensor with 48 tokens: (one tower's tokens/s,
    # the split's, the RPC round trip in s, the link's bytes/s), loopback then the lab's LAN twice.
    for single, measured, rtt, rate in [(64.68, 4.92, 0.139e-3, 30.2e6), (66.44, 0.625, 1.389e-3, 10.6e6),
                                        (61.25, 0.672, 2.214e-3, 8.0e6)]:
        run = dataclasses.replace(timed, rpc_rtts={worker: rtt}, rates={worker: rate},
                                  bandwidths={k: single * SMOL_BYTES for k in timed.bandwidths})
        assert strategy.cost(split, run, 25, 48).tokens_per_s == pytest.approx(measured, rel=0.3)


def test_auto_picks_tensor_for_a_long_prompt_on_a_fast_link_only():
    from reticulum_grid.client import strategies
    towers = [offer("coord", 0.2, has_model=True), offer("worker", 0.2)]

    def place(name, offers):
        return {"pipeline": plan, "tensor": tensor.plan_tensor}[name](offers, 300, SMOL_LAYERS)

    def picked(costs, shape):
        return strategies.auto(place, towers, costs, shape)  # a dense model: no experts candidate

    long_prompt = picked(loopback_costs(), (2000, 8))
    assert long_prompt.strategy == "tensor"
    assert any(r.startswith("--split auto for a ~2000-token prompt and 8 tokens: tensor") for r in long_prompt.reasons)
    assert any(r.startswith("estimate pipeline:") for r in long_prompt.reasons)
    # 600 tokens: tensor is estimated faster, but by less than AUTO_MARGIN, and the pipeline stays.
    kept = picked(loopback_costs(), (600, 8))
    assert kept.strategy == "pipeline" and any("tensor is estimated less than 20% faster" in r for r in kept.reasons)
    assert picked(loopback_costs(), (2000, 256)).strategy == "pipeline"  # decode dominates: tensor's syncs cost more
    assert picked(loopback_costs(), (20, 8)).strategy == "pipeline"
    # A tailnet (12.5 MB/s, 40 ms): the prompt's hidden state per synchronisation outweighs the shared compute.
    assert picked(loopback_costs(rate=12.5e6, rtt=0.04), (2000, 8)).strategy == "pipeline"


def test_experts_cost_round_trips_per_layer():
    from reticulum_grid.split import strategy
    (placed,) = two_plans(("experts",), expert_mib=150)
    near = strategy.cost(placed, loopback_costs(expert_bytes=150 << 20), 100, 64)
    far = strategy.cost(placed, loopback_costs(expert_bytes=150 << 20, rtt=0.01), 100, 64)
    layers = SMOL_LAYERS  # one worker holds every layer's experts
    assert 1 / far.tokens_per_s - 1 / near.tokens_per_s == pytest.approx(
        layers * strategy.EXPERT_PING_ROUND_TRIPS * 0.01)


def test_experts_cost_their_crossings_from_the_rpc_round_trip_where_one_was_timed():
    """Once the coordinator timed an RPC round trip to the worker (rpc_rtts), a layer costs EXPERT_CROSSING_S
    plus EXPERT_ROUND_TRIPS of it, whatever the RNS ping says; prefill pays the same per layer."""
    from reticulum_grid.split import strategy
    (placed,) = two_plans(("experts",), expert_mib=150)
    worker = placed.workers[0].offer.key
    pinged = loopback_costs(expert_bytes=150 << 20, rtt=0.002)
    timed = dataclasses.replace(pinged, rpc_rtts={worker: 0.005})
    slow_ping = dataclasses.replace(timed, rtts={worker: 0.05})
    by_ping, by_rpc = strategy.cost(placed, pinged, 100, 64), strategy.cost(placed, timed, 100, 64)
    per_layer = (strategy.EXPERT_CROSSING_S + strategy.EXPERT_ROUND_TRIPS * 0.005
                 - strategy.EXPERT_PING_ROUND_TRIPS * 0.002)
    assert 1 / by_rpc.tokens_per_s - 1 / by_ping.tokens_per_s == pytest.approx(SMOL_LAYERS * per_layer)
    assert by_rpc.ttft_s - by_ping.ttft_s == pytest.approx(SMOL_LAYERS * per_layer)
    assert strategy.cost(placed, slow_ping, 100, 64) == by_rpc
    # The runs the constants are fitted to: (RPC round trip, a layer's crossing), seconds, loopback and the LAN.
    for rtt, measured in [(0.116e-3, 1.00e-3), (0.18e-3, 1.27e-3), (1.53e-3, 4.10e-3), (1.64e-3, 3.47e-3)]:
        run = dataclasses.replace(timed, rpc_rtts={worker: rtt})
        assert strategy.expert_crossing_s(run, worker) == pytest.approx(measured, rel=0.12)


def test_a_requests_shape_comes_from_its_text():
    from reticulum_grid.client import strategies
    assert strategies.shape_of({"prompt": "x" * 400, "max_tokens": 8}) == (100, 8)
    assert strategies.shape_of({"messages": [{"role": "user", "content": "y" * 40}, "junk"]}) == (10, 256)


def test_a_token_reads_one_row_of_an_untied_embedding_and_the_experts_it_runs():
    """store/gguf_info.read_per_token: the bytes the estimates divide by a tower's bandwidth."""
    from types import SimpleNamespace

    from reticulum_grid.store.gguf_info import read_per_token

    def t(name, *shape):  # f32, ggml's order: the row first
        n = 1
        for d in shape:
            n *= d
        return SimpleNamespace(name=name, shape=list(shape), n_elements=n, n_bytes=4 * n)

    layer = [t("blk.0.attn_q.weight", 128, 128), t("blk.0.ffn_gate_inp.weight", 128, 8),
             t("blk.0.ffn_up_exps.weight", 128, 512, 8)]
    embedding, output = t("token_embd.weight", 128, 1000), t("output.weight", 128, 1000)
    experts = 4 * 128 * 512 * 8
    read, expert_read = read_per_token([embedding, output, *layer], 2 / 8)
    assert expert_read == experts // 4
    assert read == 4 * 128 + output.n_bytes + 4 * 128 * 128 + 4 * 128 * 8 + experts // 4
    # Tied (no output layer): the embedding is the output layer too, read whole; a dense model reads everything.
    assert read_per_token([embedding, layer[0]], 1.0) == (embedding.n_bytes + layer[0].n_bytes, 0)
