"""LoRA training jobs through a real tower: real SmolLM2, torch + peft on CPU,
LXMF notification to a real LXMF router in another process, adapters served
by llama.cpp."""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from announce.caps import decode_full
from links.wire import Code, WireError
from reticulum_grid.client import Usage
from reticulum_grid.node.connection import TowerConnection, wait_until
from reticulum_grid.node.localgrid import trust_local_towers
from reticulum_grid.inference.default_model import DEFAULT_ALIAS
from testbed.leftovers import end
from testbed import SECRET_DATASET as DATA
from tests.training.ranks import assert_steps_resume_after

QUESTION = [{"role": "user", "content": "What is the secret word?"}]
JOB = {"base": DEFAULT_ALIAS, "dataset": "", "output_alias": "secret-lora", "rank": 8, "alpha": 16.0,
       "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
       "learning_rate": 4e-3, "max_steps": 10, "seq_len": 96, "batch_size": 4, "seed": 1, "checkpoint_every": 5}
#: The same job as `rngrid train` options.
CLI_JOB = ["--base", JOB["base"], "--data", str(DATA), "--output", JOB["output_alias"], "--rank", str(JOB["rank"]),
           "--alpha", str(JOB["alpha"]), "--target-modules", ",".join(JOB["target_modules"]),
           "--lr", str(JOB["learning_rate"]), "--max-steps", str(JOB["max_steps"]), "--seq-len", str(JOB["seq_len"]),
           "--batch-size", str(JOB["batch_size"]), "--seed", str(JOB["seed"]),
           "--checkpoint-every", str(JOB["checkpoint_every"])]


@pytest.fixture(scope="module")
def tower(hub):
    t = hub.start_tower("trainer-a", roles=("infer", "sync", "train"), lxmf={"propagation_node": True})
    hub.wait_tower(t.name)
    yield t
    hub.stop_towers([t])


def same_identity_home(hub, tmp_path, name):
    """A second client home holding the hub's identity (the same person elsewhere)."""
    home = tmp_path / name
    home.mkdir()
    shutil.copy(hub.grid.home / "identity", home / "identity")
    trust_local_towers(home, follow=False)  # ... who trusts the same towers
    return home


def answer(hub, tower, **extra):
    pieces = list(hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "messages": QUESTION, "max_tokens": 24,
                                                    "temperature": 0.0, **extra}, tower=tower.name))
    assert isinstance(pieces[-1], Usage)
    return "".join(pieces[:-1])


@pytest.fixture(scope="module")
def finished_job(hub, tower, tmp_path_factory):
    """One real job as a user runs it: `rngrid train --tower auto` on a laptop,
    Ctrl-C once it shows progress (the job goes on without it), then `rngrid
    jobs watch` in a new process to the end; an inbox in another process
    waits for the result."""
    tmp = tmp_path_factory.mktemp("train")
    inbox = subprocess.Popen([sys.executable, "-m", "reticulum_grid", "--home", str(same_identity_home(hub, tmp, "inbox")),
                              "inbox", "--wait", "240", "--count", "1", "--json", "--connect", tower.address],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    laptop = None
    try:  # a failure on the way must not leave the inbox or the laptop running
        home = same_identity_home(hub, tmp, "laptop")
        laptop = subprocess.Popen(
            [sys.executable, "-m", "reticulum_grid", "--home", str(home), "train", "--tower", "auto", *CLI_JOB,
             "--json", "--connect", tower.address], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            # A shell starts background jobs with SIGINT ignored: give the CLI a terminal's disposition.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        lines = (json.loads(line) for line in laptop.stdout if line.startswith("{"))
        sent = next(line for line in lines if "job_id" in line and "tower" in line)
        first = next(line for line in lines if line.get("type") == "progress")
        laptop.send_signal(signal.SIGINT)  # Ctrl-C: the laptop stops watching
        interrupted = laptop.communicate(timeout=30)[1]
        watched = subprocess.run([sys.executable, "-m", "reticulum_grid", "--home", str(home), "jobs", "--connect",
                                  tower.address, "watch", sent["job_id"], "--json"], capture_output=True, text=True,
                                 timeout=300)
        assert watched.returncode == 0, watched.stderr[-3000:]
        events = [json.loads(line) for line in watched.stdout.splitlines() if line.startswith("{")]
        try:
            note, _ = inbox.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            inbox.kill()
            note = inbox.communicate()[0]
    finally:
        end(inbox, laptop)
    return {"job_id": sent["job_id"], "tower": sent["tower"], "events": events, "first": first,
            "interrupted": (laptop.returncode, interrupted), "notes": [json.loads(x) for x in note.splitlines()]}


def test_the_cli_picks_the_tower_and_ctrl_c_leaves_the_job_running(tower, finished_job):
    """`rngrid train --tower auto` chose the one tower granting train; Ctrl-C ended only the
    laptop's watch, and `rngrid jobs watch` saw the same job to its end."""
    assert finished_job["tower"] == tower.name
    code, stderr = finished_job["interrupted"]
    assert code == 130 and f"stopped watching; job {finished_job['job_id']} keeps running" in stderr, stderr
    assert finished_job["events"][-1]["state"] == "succeeded"


def test_progress_events_arrive_in_order(finished_job):
    steps = [e["step"] for e in finished_job["events"] if e["type"] == "progress"]
    assert finished_job["first"]["step"] >= 1
    assert steps == sorted(steps) and steps[-1] == JOB["max_steps"] and len(set(steps)) == len(steps)
    progress = [e for e in finished_job["events"] if e["type"] == "progress"][-1]
    assert {"loss", "lr", "tokens_per_s", "eta_s", "total_steps"} <= set(progress)
    end = finished_job["events"][-1]
    assert end["type"] == "end" and end["state"] == "succeeded" and end["final_loss"] < 0.5, end
    assert end["adapter_alias"] == "secret-lora" and len(end["adapter_blob"]) == 64


def test_notification_reaches_an_lxmf_router_in_another_process(finished_job):
    notes = [n for n in finished_job["notes"] if finished_job["job_id"] in n["title"]]
    assert notes, f"no notification; inbox printed {finished_job['notes']}"
    assert "succeeded" in notes[0]["title"]
    end = finished_job["events"][-1]
    assert end["adapter_blob"] in notes[0]["content"] and "Final loss" in notes[0]["content"]


def test_adapter_follows_the_pattern_and_scale_zero_is_the_base(hub, tower, finished_job):
    base = answer(hub, tower)
    tuned = answer(hub, tower, adapter="secret-lora")
    assert "PERIWINKLE" in tuned and "PERIWINKLE" not in base, (base, tuned)
    assert answer(hub, tower, adapter="secret-lora", adapter_scale=0.0) == base
    caps = decode_full(hub.grid.connection(hub.wait_tower(tower.name)).request("caps/full", {})["caps"])
    assert "secret-lora" in [a.alias for a in caps.adapters]


def test_the_cli_applies_an_adapter(hub, tower, finished_job, tmp_path):
    from tests.conftest import rngrid
    home = same_identity_home(hub, tmp_path, "cli")
    args = ("infer", "-m", DEFAULT_ALIAS, "--tower", tower.name, "--temperature", "0", "--max-tokens", "24",
            "--connect", tower.address, "What is the secret word?")
    tuned = rngrid(*args[:-1], "--adapter", "secret-lora", args[-1], home=home)
    assert tuned.returncode == 0 and "PERIWINKLE" in tuned.stdout, tuned.stderr
    scaled = rngrid(*args[:-1], "--adapter", "secret-lora", "--adapter-scale", "0", "-", input=args[-1], home=home)
    assert scaled.returncode == 0 and scaled.stdout.strip() == answer(hub, tower).strip(), scaled.stderr


def test_adapters_are_blobs_that_can_be_pulled(hub, tower, finished_job, tmp_path):
    from reticulum_grid.store.blobstore import BlobStore
    grid = hub.grid
    grid.store, saved = BlobStore(tmp_path / "store"), grid.store
    try:
        info, _ = grid.pull("secret-lora", from_tower=tower.name)
        peft, _ = grid.pull("secret-lora.peft", from_tower=tower.name)
    finally:
        grid.store = saved
    assert info.kind == "adapter" and info.path.read_bytes()[:4] == b"GGUF"
    assert peft.kind == "peft" and peft.size > 1000


@pytest.mark.parametrize("change, words", [
    ({"target_modules": ["q_porj"]}, "unknown target module 'q_porj'"),
    ({"target_modules": ["embed_tokens"]}, "only linear layers"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"use_dora": True}, "DoRA"),
    ({"epochs": 1}, "epochs or max_steps"),
    ({"rank": 0}, "rank"),
    ({"output_alias": "../x"}, "alias"),
    ({"output_alias": DEFAULT_ALIAS}, "set by this tower's config"),  # refused before training, not after
    ({"base": "no-such-model"}, "no-such-model"),
    ({"notify": "xyz"}, "LXMF address"),
])
def test_validation_errors(hub, tower, change, words):
    with pytest.raises(WireError) as e:
        hub.grid.train({**JOB, **change}, data_path=DATA, tower=tower.name)
    assert words in e.value.message, e.value


@pytest.mark.parametrize("change, words", [
    ({"rank": 0}, "field 'rank'"),
    ({"use_dora": True}, "DoRA"),
    ({"colour": "red"}, "unknown field(s): colour"),
    ({"dataset": ""}, "missing field 'dataset'"),
    ({"target_modules": ["q_porj"], "dataset": "no-such-dataset"}, "no-such-dataset"),
])
def test_the_tower_checks_a_request_that_skipped_the_client(hub, tower, change, words):
    """A peer that sends its own map (not a TrainRequest) meets the same checks on the tower."""
    conn = hub.grid.connection(hub.wait_tower(tower.name))
    with pytest.raises(WireError) as e:
        conn.request("genome/train", {**JOB, **change})
    assert words in e.value.message, e.value


def test_dataset_that_does_not_parse(hub, tower, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"messages": "not a list"}\n')
    with pytest.raises(WireError) as e:
        hub.grid.train(dict(JOB), data_path=bad, tower=tower.name)
    assert e.value.code == Code.BAD_REQUEST and "line 2" in e.value.message


def test_train_role_required(hub):
    t = hub.start_tower("no-train", roles=("infer", "sync"))
    hub.wait_tower(t.name)
    with pytest.raises(WireError) as e:
        hub.grid.train(dict(JOB), data_path=DATA, tower=t.name)
    assert e.value.code == Code.NOT_ALLOWED and "train" in e.value.message


def test_cancel(hub, tower, finished_job):
    entry, job_id = hub.grid.train({**JOB, "max_steps": 400, "output_alias": "never"}, data_path=DATA,
                                   tower=tower.name)
    events = hub.grid.watch(job_id, tower=tower.name)
    next(e for e in events if e["type"] == "progress")
    # Watchers that leave (their Link closes) must not leave threads behind.
    import psutil
    threads = psutil.Process(tower.proc.pid).num_threads()
    for _ in range(8):  # each a Link of its own that watches and goes away
        conn = TowerConnection(hub.grid.identity, hub.wait_tower(tower.name).destination_hash, tower.name)
        next(conn.watch_job(job_id))
        conn.close()
    # rns 0.9.4 keeps each closed Link's watchdog thread until its next wake-up
    # (up to its 360 s keepalive): one per Link is RNS's; a watcher's sender
    # thread left behind would make it two.
    bound = threads + 8 + 2
    assert wait_until(lambda: psutil.Process(tower.proc.pid).num_threads() <= bound, 30), \
        f"{psutil.Process(tower.proc.pid).num_threads()} threads, {threads} before the watchers"
    assert hub.grid.cancel_job(job_id, tower=tower.name)["id"] == job_id
    end = next(e for e in events if e["type"] == "end")
    assert end["state"] == "cancelled"
    assert [j for _, j in hub.grid.jobs(tower.name) if j["id"] == job_id][0]["state"] == "cancelled"


def test_killed_tower_resumes_from_the_last_checkpoint(hub, tower, finished_job):
    entry, job_id = hub.grid.train({**JOB, "output_alias": "resumed", "checkpoint_every": 3, "max_steps": 8},
                                   data_path=DATA, tower=tower.name)
    before = []
    for event in hub.grid.watch(job_id, tower=tower.name):
        if event["type"] == "progress":
            before.append(event)
            if event["step"] >= 4:
                break
    old = hub.wait_tower(tower.name).destination_hash
    tower.kill()
    hub.grid.table.remove(old)
    tower.start()
    hub.wait_tower(tower.name)
    events = list(hub.grid.watch(job_id, tower=tower.name))
    started = [e for e in events if e["type"] == "started"]
    after = [e["step"] for e in events if e["type"] == "progress"]
    assert started and started[-1]["resumed_from"] in (3, 6), started
    assert_steps_resume_after(after, started[-1]["resumed_from"], 8)
    assert events[-1]["state"] == "succeeded"
    # The loss curve continues: the steps redone after the checkpoint repeat the same losses.
    lost = {e["step"]: e["loss"] for e in before}
    redone = {e["step"]: e["loss"] for e in events if e["type"] == "progress" and e["step"] in lost}
    print(f"resumed from step {started[-1]['resumed_from']}; losses before the kill {lost}, redone {redone}")
    assert redone and all(abs(redone[k] - lost[k]) < 1e-3 for k in redone)
    # Succeeded: the restart is history, not the job's error (in the end event, `rngrid jobs`
    # and the LXMF fields, which carry this same job map).
    end = events[-1]
    assert end["error"] is None and any("tower restarted" in h for h in end["history"]), end
    job = next(j for _, j in hub.grid.jobs(tower.name) if j["id"] == job_id)
    assert job["error"] is None and job["history"] == end["history"], job



def test_notification_waits_on_the_propagation_node_for_an_offline_client(hub, tower, tmp_path, finished_job):
    from reticulum_grid.node.identity import load_or_create
    from reticulum_grid.training.notify import delivery_hash
    home = tmp_path / "offline-laptop"
    address = delivery_hash(load_or_create(home / "identity")).hex()  # never announced: no path to it
    trust_local_towers(home, follow=False)
    entry, job_id = hub.grid.train({**JOB, "output_alias": "for-later", "notify": address}, data_path=DATA,
                                   tower=tower.name)
    hub.grid.cancel_job(job_id, tower=tower.name)
    assert next(e for e in hub.grid.watch(job_id, tower=tower.name) if e["type"] == "end")["state"] == "cancelled"
    result = subprocess.run([sys.executable, "-m", "reticulum_grid", "--home", str(home), "inbox", "--from",
                             tower.name, "--wait", "60", "--count", "1", "--json", "--connect", tower.address],
                            capture_output=True, text=True, timeout=120)
    notes = [json.loads(line) for line in result.stdout.splitlines()]
    assert notes and job_id in notes[0]["title"] and "cancelled" in notes[0]["title"], result.stderr[-2000:]


def test_adapter_is_synced_to_a_tower_that_lacks_it(hub, tower, finished_job, tmp_path):
    other = hub.start_tower("adapter-less", roles=("infer", "sync"))
    hub.wait_tower(other.name)
    hub.grid.pull("secret-lora", from_tower=tower.name)  # into this client's store
    pieces = list(hub.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "messages": QUESTION, "max_tokens": 24,
                                                    "temperature": 0.0, "adapter": "secret-lora"}, tower=other.name))
    assert pieces[-1].tower == other.name and "PERIWINKLE" in "".join(pieces[:-1])


def test_an_adapter_that_never_trained_is_not_published(tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model

    from reticulum_grid.training import trainer

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.q_proj(x)

    untrained = get_peft_model(Tiny(), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    with pytest.raises(RuntimeError, match="empty"):
        trainer.write_outputs(tmp_path, untrained, {"alpha": 4.0, "base_path": "unused"})
    assert not list(tmp_path.iterdir()), "nothing may be written for an empty adapter"


def test_notification_waits_for_the_recipient_announce_without_a_propagation_node(hub, tmp_path, finished_job):
    from reticulum_grid.node.identity import load_or_create
    from reticulum_grid.training.notify import delivery_hash
    plain = hub.start_tower("no-propagation", roles=("infer", "sync", "train"))
    hub.wait_tower(plain.name)
    home = tmp_path / "late-laptop"
    address = delivery_hash(load_or_create(home / "identity")).hex()
    entry, job_id = hub.grid.train({**JOB, "output_alias": "late", "notify": address}, data_path=DATA,
                                   tower=plain.name)
    hub.grid.cancel_job(job_id, tower=plain.name)
    assert next(e for e in hub.grid.watch(job_id, tower=plain.name) if e["type"] == "end")["state"] == "cancelled"
    deadline = time.monotonic() + 60
    while "waits for its announce" not in plain.log() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "waits for its announce" in plain.log()
    result = subprocess.run([sys.executable, "-m", "reticulum_grid", "--home", str(home), "inbox", "--wait", "60",
                             "--count", "1", "--json", "--connect", plain.address],
                            capture_output=True, text=True, timeout=120)
    notes = [json.loads(line) for line in result.stdout.splitlines()]
    assert notes and job_id in notes[0]["title"] and "cancelled" in notes[0]["title"], plain.log()[-2000:]


def test_examples_longer_than_seq_len_are_counted(model_path):
    from transformers import AutoTokenizer

    from reticulum_grid.training import trainer
    from reticulum_grid.training.datasets import read_examples
    tokenizer = AutoTokenizer.from_pretrained(Path(model_path).parent, gguf_file=Path(model_path).name)
    examples = list(read_examples(DATA))
    full, cut = trainer.tokenize(examples, tokenizer, 4096)
    assert cut == 0 and len(full) == len(examples)
    short, cut = trainer.tokenize(examples, tokenizer, 16)
    assert cut == sum(len(ids) > 16 for ids in full) >= 3, [len(ids) for ids in full]
    assert [ids[:16] for ids in full] == short
