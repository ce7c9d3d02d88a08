"""What a split costs before it runs (split/estimate.py) and when "auto"
runs a model whole instead (client/split.py choose, client/estimates.py
best_single): pure functions on plans and caps, no network."""

import pytest

from announce.caps import Caps, Hardware
from announce.table import TowerEntry, TowerTable
from links.wire import Code, WireError
from reticulum_grid.client import router
from reticulum_grid.client.estimates import bandwidth, best_single
from reticulum_grid.client.split import MIN_SPLIT_TOKENS_S, choose
from reticulum_grid.split import estimate
from reticulum_grid.split.plan import Offer, plan

GB = 1 << 30


def key(name):
    return name.encode().ljust(16, b"\0")


def two_tower_plan(rtt_s):
    offers = [Offer("coord", key("coord"), 20 * 1024, has_model=True), Offer("worker", key("worker"), 20 * 1024, rtt_s)]
    return plan(offers, 30 * 1024, 40)


def test_each_stage_reads_its_share_and_each_worker_adds_its_round_trips():
    placement = two_tower_plan(0.040)
    bw = {key("coord"): 100e9, key("worker"): 100e9}
    alone = estimate.split(placement, 10 * GB, bw, {key("worker"): 0.0}, 4096)
    far = estimate.split(placement, 10 * GB, bw, {key("worker"): 0.040}, 4096)
    crossing = alone.link_bytes_per_token / estimate.PRIOR_LINK_RATE  # the hidden state there and back, per token
    assert 1 / alone.tokens_per_s == pytest.approx(10 * GB / 100e9 + crossing)  # the same bytes read, at the same rate
    assert 1 / far.tokens_per_s - 1 / alone.tokens_per_s == pytest.approx(estimate.ROUND_TRIPS_PER_STAGE * 0.040)
    assert far.added_ttft_s > alone.added_ttft_s > 0  # the prompt's activations cross the link either way


def test_each_token_moves_the_hidden_state_both_ways_and_the_mask_over_each_worker_link():
    fixed = estimate.RPC_FIXED_BYTES_PER_TOKEN
    assert estimate.link_bytes_per_token(8192, 100) == 3 * 8192 * 4 + 256 * 2 + fixed
    assert estimate.link_bytes_per_token(8192, 257) == 3 * 8192 * 4 + 512 * 2 + fixed  # the mask's cells pad to 256
    placement = two_tower_plan(0.0)
    bw = {key("coord"): 100e9, key("worker"): 100e9}
    slow = estimate.split(placement, 10 * GB, bw, {}, 4096, {key("worker"): 1e6})
    fast = estimate.split(placement, 10 * GB, bw, {}, 4096, {key("worker"): 1e9})
    assert slow.link_bytes_per_token == fast.link_bytes_per_token == estimate.link_bytes_per_token(4096, 100)
    assert 1 / slow.tokens_per_s - 1 / fast.tokens_per_s == pytest.approx(
        slow.link_bytes_per_token * (1 / 1e6 - 1 / 1e9))
    whole = estimate.split(plan([Offer("one", key("one"), 40 * 1024)], 30 * 1024, 40), 10 * GB,
                           {key("one"): 100e9}, {}, 4096)
    assert whole.link_bytes_per_token == 0 and whole.tokens_per_s == pytest.approx(100e9 / (10 * GB))


def test_a_slower_worker_slows_only_its_share():
    placement = two_tower_plan(0.0)
    share = {p.offer.key: p.layers / placement.n_layers for p in placement.parts}
    found = estimate.split(placement, 10 * GB, {key("coord"): 100e9, key("worker"): 10e9}, {}, 4096)
    expected = (10 * GB * share[key("coord")] / 100e9 + 10 * GB * share[key("worker")] / 10e9
                + found.link_bytes_per_token / estimate.PRIOR_LINK_RATE)
    assert 1 / found.tokens_per_s == pytest.approx(expected)


def test_bandwidth_comes_from_the_measured_rate_and_is_bounded():
    assert estimate.bandwidth("cuda", 50.0 * 4 * GB) == 50.0 * 4 * GB
    assert estimate.bandwidth("cuda") == estimate.PRIOR_BANDWIDTH["cuda"]
    assert estimate.bandwidth("cpu", 1e9 * 100 * GB) == estimate.MAX_BANDWIDTH  # a boast is clamped
    assert estimate.bandwidth("unheard-of") == estimate.PRIOR_BANDWIDTH["cpu"]


def test_auto_runs_whole_when_the_single_tower_is_at_least_as_fast():
    split = estimate.Estimate(8.0, 0.2, "a + b")
    assert choose("m", split, estimate.Estimate(12.0, 0.0, "big")) is False
    assert choose("m", split, estimate.Estimate(8.0, 0.0, "big")) is False
    assert choose("m", split, estimate.Estimate(3.0, 0.0, "big")) is True
    assert choose("m", split, None) is True


def test_auto_refuses_a_split_slower_than_the_floor_with_the_way_out():
    with pytest.raises(WireError) as refused:
        choose("m", estimate.Estimate(MIN_SPLIT_TOKENS_S / 2, 3.0, "a + b"), None)
    assert refused.value.code == Code.TOO_SLOW
    assert "tokens/s" in refused.value.message and "--split always" in refused.value.message


class HealthOnly:
    """Test double of a Grid: the estimates read only its health book and its table."""

    def __init__(self, *entries):
        self.health = router.HealthBook()
        self.table = TowerTable()
        for e in entries:
            self.table.update(e.destination_hash, e.caps, 1)


def entry(name, **hardware):
    return TowerEntry(key(name), Caps(name, Hardware(**hardware)), 1, 0.0)


def test_best_single_counts_a_gpu_towers_ram_and_reads_the_rest_at_cpu_pace():
    gpu = entry("g3090", backend="cuda", vram_total_mib=24576, vram_free_mib=20000, ram_total_mib=65536,
                ram_free_mib=60000)
    cpu = entry("laptop", backend="cpu", ram_total_mib=16384, ram_free_mib=12000)
    model = 30 * GB
    found = best_single(HealthOnly(), [gpu, cpu], model, 30 * 1024, {})
    assert found is not None and found.where == "g3090"
    in_vram = 20000 / (30 * 1024)
    pace = 1 / (in_vram / estimate.PRIOR_BANDWIDTH["cuda"] + (1 - in_vram) / estimate.PRIOR_BANDWIDTH["cpu"])
    assert found.tokens_per_s == pytest.approx(pace / model)
    # Beyond VRAM and RAM together nothing holds it whole.
    assert best_single(HealthOnly(), [gpu, cpu], 100 * GB, 100 * 1024, {}) is None


def test_a_lender_serving_no_model_reads_at_the_pace_measured_of_its_kind():
    """A split's lenders serve no model whole, so nothing measured them: a tower of the same backend and
    device that serves one lends them its measured bandwidth (tokens/s x bytes a token reads), not the prior."""
    single = entry("single", backend="cpu", device="EPYC")
    lender, other = entry("lender", backend="cpu", device="EPYC"), entry("laptop", backend="cpu", device="M2")
    grid = HealthOnly(single, lender, other)
    grid.health.measured(single.destination_hash, 400.0, single.caps.hardware)  # too short for a decode rate
    served = {single.destination_hash: 40_000_000}
    assert bandwidth(grid, single, served) == bandwidth(grid, lender, served) == 400.0 * 40_000_000
    assert bandwidth(grid, other, served) == estimate.PRIOR_BANDWIDTH["cpu"]
    # Its decode rate, once measured (the stream's rate counts the prompt's time too), is what counts.
    grid.health.measured(single.destination_hash, 400.0, single.caps.hardware, 500.0)
    assert bandwidth(grid, lender, served) == 500.0 * 40_000_000
