"""Fault campaign: real towers killed and frozen while they work, on loopback RNS.

- Stream kills: two towers with the bundled model; the tower serving a
  temperature-0 stream is killed (SIGKILL) after a random number of pieces.
  Counted: continued with text identical to an uninterrupted run / different /
  failed with a clear error (WireError) / hung (no end within STREAM_LIMIT_S).
- Stream freezes: the serving tower is frozen (SIGSTOP) instead; counted as
  above, with the seconds from the freeze to the first text from the other tower.
- Training kills: a LoRA job's tower is killed mid-job and restarted; counted:
  resumed from a checkpoint and succeeded / lost.
- Sync kills: a puller (``rngrid pull``, its own process) is killed mid-transfer,
  one chunk it had verified is corrupted on its disk, and the pull is run again;
  counted: resumed to a blob whose BLAKE3 matches the source / corrupt blob
  published / failed.

Profiles: ``--quick`` (the default, a few minutes on 2 cores) and ``--full``
(20 stream kills, 5 freezes, 5 training kills, 10 sync kills).
Last line: ``faults_ok=<ok>/<total>``; goal: all ok, 0 hung, 0 lost, 0 corrupt.
"""

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import blake3

from links.wire import WireError
from reticulum_grid.client import Grid, Usage
from reticulum_grid.inference.default_model import DEFAULT_ALIAS, default_model_path
from reticulum_grid.node import identity, rnsnet
from reticulum_grid.node.localgrid import TowerProcess, free_port, trust_local_towers
from reticulum_grid.store.blobstore import BlobStore

PROFILES = {"quick": {"kills": 3, "freezes": 2, "train_kills": 1, "sync_kills": 3},
            "full": {"kills": 20, "freezes": 5, "train_kills": 5, "sync_kills": 10}}
PROMPT = "Count from 1 to 500, separated by commas: 1, 2, 3,"
MAX_TOKENS = 120
#: A stream, job watch or pull not finished within this long is counted as hung (seconds).
STREAM_LIMIT_S = 90.0
JOB_LIMIT_S = 300.0
PULL_LIMIT_S = 120.0
DATA = Path(__file__).resolve().parent.parent / "testbed" / "data" / "secret.jsonl"
JOB = {"base": DEFAULT_ALIAS, "dataset": "", "rank": 8, "alpha": 16.0, "target_modules": ["q_proj", "v_proj"],
       "learning_rate": 1e-3, "max_steps": 12, "seq_len": 64, "batch_size": 2, "seed": 1, "checkpoint_every": 4}
BLOB_MIB = 48


class Lab:
    """The bench process's Grid (a TCP server the towers connect to) and its towers."""

    def __init__(self, root):
        self.root = root
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        home = root / "client"
        self.client_id = identity.load_or_create(home / "identity").hash.hex()
        trust_local_towers(home)  # this client trusts the towers it starts
        self.grid = Grid(home=home, rns_config=rnsnet.write_config(home / "rns", listen=self.address))
        self.towers = []

    def start(self, name, roles=("infer",), **kwargs):
        tower = TowerProcess(self.root, name, kwargs.pop("models", {DEFAULT_ALIAS: default_model_path()}),
                             allow={self.client_id: list(roles)}, connect=[self.address], **kwargs)
        self.towers.append(tower.start())
        self.heard(tower)
        return tower

    def heard(self, tower, timeout=90.0):
        entry = self.grid.wait_for(lambda _: self.grid.table.find(tower.name), timeout)
        if not entry:
            raise RuntimeError(f"{tower.name} not heard within {timeout:.0f} s; see {tower.log_path}")
        return entry

    def revive(self, tower):
        """Make ``tower`` serve again: thaw or restart it, wait for its announce, forget its failures."""
        if tower.proc.poll() is None:
            os.kill(tower.proc.pid, signal.SIGCONT)
        else:
            old = self.grid.table.find(tower.name)
            if old:
                self.grid.table.remove(old.destination_hash)
            tower.start()
        entry = self.heard(tower)
        self.grid.health.succeeded(entry.destination_hash)
        self.grid.refresh([entry], max_age_s=0)

    def close(self):
        for tower in self.towers:
            if tower.proc and tower.proc.poll() is None:
                os.kill(tower.proc.pid, signal.SIGCONT)
            tower.stop()
        self.grid.close()
        rnsnet.stop()


def bounded(work, limit_s):
    """Run ``work()`` on a thread; (result, error, hung)."""
    box = {}

    def run():
        try:
            box["result"] = work()
        except WireError as e:
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    return box.get("result"), box.get("error"), thread.is_alive()


def stream_round(lab, towers, reference, freeze, rng):
    """One stream whose serving tower is killed (or frozen) after a random number of pieces."""
    stream = lab.grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                                               "temperature": 0.0})
    fault_after = rng.randint(3, 40)
    seen = {}

    def consume():
        pieces = []
        for piece in stream:
            pieces.append(piece)
            if len(pieces) == fault_after and stream.tower:
                seen["victim"] = towers[stream.tower]
                seen["at"] = time.monotonic()
                os.kill(seen["victim"].proc.pid, signal.SIGSTOP if freeze else signal.SIGKILL)
            elif "at" in seen and "over" not in seen and stream.tower and stream.tower != seen["victim"].name:
                seen["over"] = time.monotonic() - seen["at"]
        return pieces

    pieces, error, hung = bounded(consume, STREAM_LIMIT_S)
    if "victim" in seen:
        lab.revive(seen["victim"])
    if hung:
        return "hung", None
    if error is not None:
        return "failed", f"{error.code}: {error.message}"[:200]
    if "victim" not in seen:
        return "no fault", "the stream ended before the fault"
    assert isinstance(pieces[-1], Usage)
    text = "".join(pieces[:-1])
    return ("identical" if text == reference else "different"), seen.get("over")


def train_round(lab, trainer, k, rng):
    """A job whose tower is killed mid-job and restarted: "resumed" or "lost"."""
    _, job_id = lab.grid.train({**JOB, "output_alias": f"faults-lora-{k}"}, data_path=DATA, tower=trainer.name)
    kill_at = rng.randint(5, 10)
    last = {}

    def until_kill():
        for event in lab.grid.watch(job_id, tower=trainer.name):
            last.update(event)
            if event["type"] == "progress" and event["step"] >= kill_at:
                return True
            if event["type"] == "end":
                return False
        return False

    reached, error, hung = bounded(until_kill, JOB_LIMIT_S)
    if not reached:
        return "lost", f"the job ended before step {kill_at}: {error or json.dumps(last)[:300]}"
    trainer.kill()
    lab.revive(trainer)
    events, error, hung = bounded(lambda: list(lab.grid.watch(job_id, tower=trainer.name)), JOB_LIMIT_S)
    if hung or error is not None or not events:
        return "lost", "hung" if hung else str(error)
    started = [e for e in events if e["type"] == "started"]
    resumed = started and started[-1].get("resumed_from", 0) > 0
    if events[-1].get("state") == "succeeded" and resumed:
        return "resumed", f"from step {started[-1]['resumed_from']} (killed at {kill_at})"
    return "lost", json.dumps(events[-1])[:200]


def sync_round(lab, source, source_file, k, rng):
    """Kill a puller mid-transfer, corrupt a chunk it verified, pull again:
    "resumed" (the blob verifies), "corrupt" (a bad blob was published) or "failed"."""
    home = lab.root / f"puller-{k}"
    home.mkdir()
    (home / "identity").write_bytes((lab.root / "client" / "identity").read_bytes())  # allowed to sync
    trust_local_towers(home, follow=False)
    argv = [sys.executable, "-m", "reticulum_grid", "--home", str(home), "pull", "faults-blob", "--json",
            "--from", source.name, "--connect", source.address]
    puller = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    kill_at = rng.uniform(0.1, 0.6)
    try:
        for line in puller.stdout:
            progress = json.loads(line).get("progress") if line.startswith("{") else None
            if progress and progress["done_bytes"] >= kill_at * progress["total_bytes"]:
                puller.kill()
                break
    finally:
        puller.kill()
        puller.wait(10)
    partials = list((home / "blobs" / "partial").glob("*/have"))
    if not partials:
        return "failed", "the puller finished before it was killed"
    have = partials[0].read_bytes()
    verified = [i for i, v in enumerate(have) if v]
    if verified:
        index = rng.choice(verified)
        with open(partials[0].parent / "data", "r+b") as f:  # one verified chunk goes bad on disk
            f.seek(index * (1 << 20) + rng.randrange(1 << 20))
            f.write(b"\xff\x00\xff")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PULL_LIMIT_S)
    except subprocess.TimeoutExpired:
        return "hung", None
    published = [p for p in (home / "blobs" / "objects").glob("*/data")] if (home / "blobs" / "objects").exists() else []
    if done.returncode != 0:
        return "failed", done.stderr.strip()[-200:]
    digest = blake3.blake3(published[0].read_bytes()).hexdigest() if published else None
    if digest != source_file:
        return "corrupt", f"published {digest}"
    return "resumed", f"killed at {kill_at:.0%}, {len(verified)} chunks verified, one corrupted"


def report(name, outcomes, ok_kinds):
    counts = {}
    for kind, _ in outcomes:
        counts[kind] = counts.get(kind, 0) + 1
    print(f"{name}: {len(outcomes)} rounds: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), flush=True)
    return sum(1 for kind, _ in outcomes if kind in ok_kinds)


def streams(lab, counts, rng):
    """Stream kills and freezes on two towers; (ok, total)."""
    towers = {t.name: t for t in (lab.start("faults-a"), lab.start("faults-b"))}
    reference = "".join(p for p in lab.grid.execute("ai/inference", {
        "model": DEFAULT_ALIAS, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0})
        if not isinstance(p, Usage))
    ok = total = 0
    for freeze, label, rounds in ((False, "stream kills", counts["kills"]), (True, "stream freezes", counts["freezes"])):
        outcomes = []
        for _ in range(rounds):
            outcomes.append(stream_round(lab, towers, reference, freeze, rng))
            kind, detail = outcomes[-1]
            detail = f"{detail:.1f} s to the other tower" if isinstance(detail, float) else detail or ""
            print(f"  {label}: {kind} {detail}", flush=True)
        ok, total = ok + report(label, outcomes, {"identical"}), total + rounds
        times = [s for kind, s in outcomes if kind in ("identical", "different") and isinstance(s, float)]
        if times:
            print(f"  seconds from the fault to text from the other tower: median "
                  f"{statistics.median(times):.1f}, max {max(times):.1f}")
    for tower in towers.values():
        tower.stop()
    return ok, total


def training(lab, counts, rng):
    """Training kills; (ok, total)."""
    trainer = lab.start("faults-trainer", roles=("infer", "train", "sync"))
    outcomes = []
    for k in range(counts["train_kills"]):
        outcomes.append(train_round(lab, trainer, k, rng))
        print(f"  training kills: {outcomes[-1][0]} {outcomes[-1][1] or ''}", flush=True)
    trainer.stop()
    return report("training kills", outcomes, {"resumed"}), len(outcomes)


def syncing(lab, counts, rng):
    """Sync kills with a corrupted chunk; (ok, total)."""
    blob = lab.root / "blob.bin"
    blob.write_bytes(os.urandom(BLOB_MIB << 20))
    source = TowerProcess(lab.root, "faults-source", {}, allow={lab.client_id: ["sync"]}, connect=[lab.address])
    BlobStore(source.dir / "blobs").add_file(blob, alias="faults-blob", kind="file")
    lab.towers.append(source.start())
    lab.heard(source)
    digest = blake3.blake3(blob.read_bytes()).hexdigest()
    outcomes = []
    for k in range(counts["sync_kills"]):
        outcomes.append(sync_round(lab, source, digest, k, rng))
        print(f"  sync kills: {outcomes[-1][0]} {outcomes[-1][1] or ''}", flush=True)
    source.stop()
    return report("sync kills", outcomes, {"resumed"}), len(outcomes)


PARTS = {"streams": streams, "training": training, "sync": syncing}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_const", dest="profile", const="quick", help="a few rounds (default)")
    group.add_argument("--full", action="store_const", dest="profile", const="full", help="the full campaign")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of: {', '.join(PARTS)}")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    counts = PROFILES[args.profile or "quick"]
    rng = random.Random(args.seed)
    ok = total = 0
    with tempfile.TemporaryDirectory(prefix="rngrid-bench-faults-") as tmp:
        lab = Lab(Path(tmp))
        try:
            for part in args.parts.split(","):
                part_ok, part_total = PARTS[part.strip()](lab, counts, rng)
                ok, total = ok + part_ok, total + part_total
        finally:
            lab.close()
    print(f"faults_ok={ok}/{total}")


if __name__ == "__main__":
    main()
