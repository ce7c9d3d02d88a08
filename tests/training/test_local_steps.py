"""Local steps with rare averaging (DiLoCo): the outer step and the choice of sync on their
own (single process, a toy model: named as such), then real worker processes on gloo with
the real SmolLM2 GGUF: two ranks against the mode computed in one process, and a rank
killed mid-job resuming from the last average."""

import json
import secrets
import pytest
import torch

from reticulum_grid.training import checkpoint, outer, rendezvous
from reticulum_grid.training.outer import OuterStep, choose, freeze_lora_a
from testbed import SECRET_DATASET as DATA
from tests.training.ranks import (JOB, adapter, assert_adapter_changes_the_answer, assert_same_adapter,
                                  assert_steps_resume_after, finish, start_rank, training_pair, watch_killing_rank_one)

# -- the choice of sync --------------------------------------------------------


@pytest.mark.parametrize("requested,h,allreduce_s,step_s,world,mode,expect_h", [
    ("auto", None, 0.005, 1.0, 2, "ddp", 1),       # a LAN: the all-reduce is 0.5 % of a step
    ("auto", None, 0.5, 1.0, 2, "local", 5),       # 50 % of a step: 0.5 / (0.1 x H) <= 1 from H = 5
    ("auto", None, 0.15, 1.0, 2, "local", 4),      # 15 %: H = 2 would do; never fewer than 4 steps
    ("auto", None, 30.0, 1.0, 2, "local", 64),     # a very slow link: at most 64 steps
    ("auto", None, 30.0, 1.0, 1, "ddp", 1),        # one rank has nobody to sync with
    ("ddp", None, 30.0, 1.0, 2, "ddp", 1),
    ("local", 8, 0.0, 1.0, 2, "local", 8),
    ("local", None, 0.001, 1.0, 2, "local", 4),
])
def test_choose(requested, h, allreduce_s, step_s, world, mode, expect_h):
    got = choose(requested, h, allreduce_s, step_s, world)
    assert (got.mode, got.local_steps) == (mode, expect_h), got
    assert f"{allreduce_s * 1000:.1f} ms" in got.reason if requested == "auto" else "not measured" in got.reason
    with pytest.raises(ValueError):
        choose("fast", None, 0.1, 1.0, 2)


# -- the outer step on a toy (a test double for the model: two tensors) --------


def _outer_round(step, params, replicas):
    """One round of ``step``: each replica's values in ``params`` in turn, their deltas' mean stepped."""
    deltas = []
    for replica in replicas:
        with torch.no_grad():
            for p, r in zip(params, replica):
                p.copy_(r)
        deltas.append(step.delta())
    step.step(sum(deltas) / len(deltas))


def test_outer_step_is_nesterov_sgd_on_the_mean_delta():
    """Two rounds of DiLoCo's outer step against its formula: v = mu v + D; theta -= lr (D + mu v)."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(4))]
    step = OuterStep(params, lr=0.7, momentum=0.9)
    theta = [p.detach().clone() for p in params]
    v = [torch.zeros_like(t) for t in theta]
    for _ in range(2):
        replicas = [[t + torch.randn_like(t) * 0.1 for t in theta] for _ in range(3)]
        _outer_round(step, params, replicas)
        for k in range(len(theta)):
            d = theta[k] - sum(r[k] for r in replicas) / len(replicas)
            v[k] = 0.9 * v[k] + d
            theta[k] = theta[k] - 0.7 * (d + 0.9 * v[k])
        for p, t in zip(params, theta):
            assert torch.allclose(p.detach(), t, atol=1e-6)
    saved = checkpoint.unpack(checkpoint.pack(step.state()))
    again = OuterStep([torch.nn.Parameter(torch.zeros_like(p)) for p in params], lr=0.7, momentum=0.9)
    again.load(saved)
    assert all(torch.equal(a.detach(), p.detach()) for a, p in zip(again.params, params))


def test_the_default_outer_step_is_the_replicas_mean():
    """The job's default outer step (lr 1, no momentum) puts the replicas' mean into the
    model each round, and nothing carries into the next round (no momentum state)."""
    assert (outer.OUTER_LR, outer.OUTER_MOMENTUM) == (1.0, 0.0)
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(4))]
    step = OuterStep(params)
    for _ in range(2):
        start = [p.detach().clone() for p in params]
        replicas = [[t + torch.randn_like(t) for t in start] for _ in range(3)]
        _outer_round(step, params, replicas)
        for k, p in enumerate(params):
            assert torch.allclose(p.detach(), sum(r[k] for r in replicas) / len(replicas), atol=1e-6)
    assert not step.optimizer.state_dict()["state"] or all(
        s.get("momentum_buffer") is None for s in step.optimizer.state_dict()["state"].values())


def _lora(freeze):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(5)
    toy = torch.nn.Sequential()
    toy.add_module("lin", torch.nn.Linear(6, 5))
    model = get_peft_model(toy, LoraConfig(r=2, lora_alpha=4, target_modules=["lin"]))
    if freeze:
        assert freeze_lora_a(model) == 1
    return model


def _product(model):
    layer = model.base_model.model.lin
    return (layer.lora_B["default"].weight @ layer.lora_A["default"].weight).detach().clone()


@pytest.mark.parametrize("freeze", [True, False])
def test_ffa_averages_b_times_a_exactly(freeze):
    """With A frozen (identical on every replica), B.A of the average is the average of
    the replicas' B.A; training A too, it is not (the gap FFA-LoRA closes)."""
    model = _lora(freeze)
    params = [p for p in model.parameters() if p.requires_grad]
    assert len(params) == (1 if freeze else 2)
    step = OuterStep(params, lr=1.0, momentum=0.0)  # plain averaging
    products, deltas = [], []
    for seed in (1, 2, 3):
        step.reset()
        optimizer = torch.optim.AdamW(params, lr=0.05)
        torch.manual_seed(seed)
        for _ in range(4):
            x = torch.randn(8, 6)
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        products.append(_product(model))
        deltas.append(step.delta())
    step.step(sum(deltas) / 3)
    mismatch = float((_product(model) - sum(products) / 3).abs().max())
    print(f"freeze_a={freeze}: max |B.A of the average - average of B.A| = {mismatch:.3g}")
    if freeze:
        assert mismatch <= 1e-6
    else:
        assert mismatch > 1e-4


# -- real ranks ------------------------------------------------------------------

SPEC = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"], "learning_rate": 4e-3,
        "max_steps": 6, "seq_len": 32, "batch_size": 4, "seed": 1, "checkpoint_every": 2,
        "output_alias": "local-test", "sync": "local", "local_steps": 2}


def start(job_dir, dp, **spec):
    return start_rank(job_dir, {**SPEC, **spec}, dp)


def two_ranks():
    return {"world_size": 2, "units": 2, "host": "127.0.0.1", "dataplane": "127.0.0.1",
            "port": rendezvous.free_port("127.0.0.1"), "secret": secrets.token_hex(32), "peers": ["127.0.0.1"]}


def steps(events):
    return {e["step"]: e["loss"] for e in events if e["event"] == "step"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The job on 2 ranks and on 1 rank holding both replicas (the mode computed in one process)."""
    tmp = tmp_path_factory.mktemp("local")
    dp = two_ranks()
    procs = [start(tmp / "rank0", {**dp, "rank": 0}), start(tmp / "rank1", {**dp, "rank": 1}),
             start(tmp / "one", {**dp, "world_size": 1, "rank": 0})]
    try:
        events = [finish(p, timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return {"two": events[0], "rank1": events[1], "one": events[2], "adapters": (adapter(procs[0]), adapter(procs[2]))}


def test_two_ranks_give_the_adapter_of_the_mode_computed_in_one_process(runs):
    two, one = steps(runs["two"]), steps(runs["one"])
    assert sorted(two) == sorted(one) == list(range(1, SPEC["max_steps"] + 1))
    assert max(abs(two[k] - one[k]) for k in two) <= 1e-4, (two, one)
    worst = assert_same_adapter(*runs["adapters"])
    print(f"max abs adapter difference 2 ranks vs 1 process: {worst:.3g}; losses {two}")
    started = next(e for e in runs["two"] if e["event"] == "started")
    assert (started["sync"], started["local_steps"], started["world_size"]) == ("local", 2, 2)
    done = next(e for e in runs["two"] if e["event"] == "done")
    # One average per 2 steps, each the trainable fp32 bytes: half what DDP's 6 all-reduces move.
    assert done["syncs"] == 3 and done["bytes_total"] == 3 * started["grad_bytes"]
    assert done["bytes_per_step"] == started["grad_bytes"] / 2 and done["step_s"] > 0
    progress = [e for e in runs["two"] if e["event"] == "step"]
    assert all(e["sync"] == "local" and e["bytes_per_step"] > 0 and len(e["ranks"]) == 2 for e in progress)
    assert [e["step"] for e in runs["two"] if e["event"] == "checkpoint"] == [2, 4]
    assert not [e for e in runs["rank1"] if e["event"] in ("step", "done")], "only rank 0 speaks for the job"


@pytest.mark.timeout(900)
def test_a_killed_rank_resumes_from_the_last_average(runs, tmp_path):
    """Rank 1 is killed after the first checkpoint; rank 0 stops (peer lost); the job
    restarts on rank 0 alone, holding both replicas, from the checkpoint: the first
    step after it is computed from the average (every replica starts a round there),
    so its loss is the uninterrupted job's."""
    dp = two_ranks()
    rank0, rank1 = start(tmp_path / "rank0", {**dp, "rank": 0}), start(tmp_path / "rank1", {**dp, "rank": 1})
    try:
        seen = []
        for line in rank0.stdout:
            seen.append(json.loads(line))
            if seen[-1]["event"] == "checkpoint":
                rank1.kill()
                break
        out, _ = rank0.communicate(timeout=300)
    finally:
        for p in (rank0, rank1):
            if p.poll() is None:
                p.kill()
    seen += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert rank0.returncode == 3 and seen[-1]["event"] == "error" and seen[-1]["peer_lost"], seen[-1]
    saved = checkpoint.load(tmp_path / "rank0" / "checkpoint.safetensors")
    assert saved["step"] in (2, 4) and saved["local_steps"] == 2
    resumed = finish(start(tmp_path / "rank0", {**dp, "world_size": 1, "rank": 0}), timeout=600)
    started = next(e for e in resumed if e["event"] == "started")
    assert (started["resumed_from"], started["sync"], started["world_size"]) == (saved["step"], "local", 1)
    after, uninterrupted = steps(resumed), steps(runs["one"])
    assert sorted(after) == list(range(saved["step"] + 1, SPEC["max_steps"] + 1))
    first = saved["step"] + 1
    print(f"resumed at step {saved['step']}; step {first} loss {after[first]} vs {uninterrupted[first]} uninterrupted")
    assert abs(after[first] - uninterrupted[first]) <= 1e-4
    assert (tmp_path / "rank0" / "adapter.safetensors").exists()


# -- through real towers over RNS --------------------------------------------------

LOCAL_JOB = {**JOB, "output_alias": "dp-local", "sync": "local", "local_steps": 2, "checkpoint_every": 2}


@pytest.fixture(scope="module")
def pair(hub):
    with training_pair(hub, "ls") as towers:
        yield towers


@pytest.mark.timeout(600)
def test_towers_train_by_local_steps_and_resume_on_the_tower_left(hub, pair):
    """The options travel with the request to both towers; rank 1's worker is killed
    mid-job; the job resumes on rank 0's tower alone from the last average (the first
    step of a round is computed at the average, so its loss repeats), and the adapter
    is served like any other."""
    a, b = pair
    _, job_id = hub.grid.train(dict(LOCAL_JOB), data_path=DATA, towers=[a.name, b.name])
    seen, kill = watch_killing_rank_one(hub, job_id, a, b)
    events = [event for _, event in seen]
    progress = [e for e in events[:kill + 1] if e["type"] == "progress"]
    assert all(e["sync"] == "local" and e["bytes_per_step"] > 0 and len(e["ranks"]) == 2 for e in progress)
    before = {e["step"]: e["loss"] for e in progress}
    end = events[-1]
    assert end["state"] == "succeeded" and end["error"] is None, end
    started = [e for e in events if e["type"] == "started"]
    assert [(s["sync"], s["local_steps"], s["world_size"]) for s in started] == [("local", 2, 2), ("local", 2, 1)]
    resumed = started[-1]["resumed_from"]
    assert resumed in (2, 4, 6), resumed
    after = {e["step"]: e["loss"] for e in events if e["type"] == "progress" and events.index(e) > events.index(
        started[-1])}
    assert_steps_resume_after(sorted(after), resumed, JOB["max_steps"])
    if resumed + 1 in before and resumed + 1 in after:
        assert abs(after[resumed + 1] - before[resumed + 1]) <= 1e-4, (before, after)
    print(f"resumed from step {resumed}; history {end['history']}")
    assert any(h.split(" ", 2)[-1].startswith("sync local: its last run sent") for h in end["history"]), end["history"]
    assert_adapter_changes_the_answer(hub, a, "dp-local")
