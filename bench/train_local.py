"""DDP against local steps over a lab link: the part of bench/train_dp.py that ``--profile`` runs.

See bench/train_dp.py's docstring for what is measured and how; run it as
``python bench/train_dp.py --profile tailnet``.
"""

import json
import re
import secrets
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from reticulum_grid.inference.default_model import default_model_path  # noqa: E402
from reticulum_grid.training import rendezvous  # noqa: E402
from reticulum_grid.training.outer import OUTER_LR, OUTER_MOMENTUM  # noqa: E402

DATA = ROOT / "testbed" / "data" / "secret.jsonl"


def local(h, lr, momentum, freeze_a=False):
    """(label, spec keys) of local steps with H = ``h`` and the outer SGD's ``lr`` and
    ``momentum`` (Nesterov when above 0; lr 1 and momentum 0 is plain averaging)."""
    return (f"H={h} {lr:g}/{momentum:g}{' FFA' if freeze_a else ''}",
            {"sync": "local", "local_steps": h, "outer_lr": lr, "outer_momentum": momentum, "freeze_a": freeze_a})


#: (label, spec keys): the ways to sync compared, on the same job: DDP, local steps with
#: plain averaging and with DiLoCo's outer step (Nesterov, lr 0.7, momentum 0.9).
MODES = (("ddp", {"sync": "ddp"}), local(8, 1.0, 0.0), local(32, 1.0, 0.0), local(8, 0.7, 0.9), local(32, 0.7, 0.9))
#: The mode of the last lines: H = 32 with the job's default outer step.
HEADLINE = local(32, OUTER_LR, OUTER_MOMENTUM)[0]


@contextmanager
def shaped_link(root, name):
    """Two hosts (namespaces) joined by the lab's bridge shaped as profile ``name``:
    yields (argv prefix of host 0, of host 1, address of host 0, of host 1, read the
    bridge's counters: a function returning its bytes both ways)."""
    from testbed.lab.netns import Namespaces
    from testbed.lab.profiles import profile
    from testbed.lab.topology import NsProcess

    shape = profile(name).shape
    ns = Namespaces()
    lab = type("BenchLab", (), {"ns": ns})()
    bridge = None
    try:
        a, link, b = ns.add("r0"), ns.add("link"), ns.add("r1")
        (addr_a, addr_b), (if_a, if_b) = ns.bridged([a, b], link)
        stats = Path(root) / "link.json"
        bridge = NsProcess(lab, link, Path(root) / "bridge", "bridge", [
            sys.executable, "-m", "testbed.lab.bridge", "--a", if_a, "--b", if_b, "--rate", str(shape.rate_bps),
            "--delay", str(shape.delay_s), "--jitter", str(shape.jitter_s), "--loss", str(shape.loss),
            "--stats", str(stats)], "ready").start()

        def moved():
            time.sleep(0.3)  # the bridge writes its counters at most every 0.1 s
            counts = json.loads(stats.read_text()) if stats.exists() else {}
            return counts.get("bytes_ab", 0) + counts.get("bytes_ba", 0)

        yield ns.argv(a, []), ns.argv(b, []), addr_a, addr_b, moved
    finally:
        if bridge is not None:
            bridge.stop(timeout=10)
        ns.close()


def final_loss(adapters, spec):
    """Mean token loss over the whole dataset of each adapter file (safetensors), in order."""
    import torch
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    from reticulum_grid.training import trainer
    from reticulum_grid.training.datasets import read_examples

    tokenizer, model = trainer.load_base(default_model_path(), "cpu", torch.float32)
    model = trainer.add_lora(model, {**spec, "freeze_a": False})
    examples, _ = trainer.tokenize(read_examples(DATA), tokenizer, spec["seq_len"])
    out = []
    for path in adapters:
        set_peft_model_state_dict(model, load_file(str(path)))
        total = count = 0.0
        with torch.no_grad():
            for ids in examples:
                x = torch.tensor([ids])
                logits = model(input_ids=x).logits[0, :-1]
                total += float(torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum"))
                count += len(ids) - 1
        out.append(total / count)
    return out


def one(tmp, label, extra, steps, run, link=None):
    """One 2-rank job: (its rank 0 events, link bytes or None, its adapter path)."""
    name = f"{re.sub('[^A-Za-z0-9]+', '-', label)}-{'link' if link else 'loop'}"
    if link is None:
        dp = {"world_size": 2, "units": 2, "host": "127.0.0.1", "dataplane": "127.0.0.1", "peers": ["127.0.0.1"],
              "port": rendezvous.free_port("127.0.0.1"), "secret": secrets.token_hex(32)}
        events = run(tmp, name, steps, dp, extra)
        return events, None, tmp / f"{name}-0" / "adapter.safetensors"
    prefix_a, prefix_b, addr_a, addr_b, moved = link
    port = 29400 + sum(1 for p in tmp.iterdir() if p.name.endswith("-link-0"))  # a fresh port per job
    dp = {"world_size": 2, "units": 2, "host": addr_a, "port": port, "secret": secrets.token_hex(32)}
    before = moved()
    events = run(tmp, name, steps, dp, extra, ranks={0: ({"dataplane": addr_a, "peers": [addr_b]}, prefix_a),
                                                     1: ({"dataplane": addr_b}, prefix_b)})
    return events, moved() - before, tmp / f"{name}-0" / "adapter.safetensors"


def pick(labels):
    """The MODES named in ``labels`` (comma-separated; "" for all), DDP and HEADLINE
    always among them (the last lines compare them). Raises SystemExit for an unknown one."""
    wanted = {label.strip() for label in labels.split(",") if label.strip()} | {"ddp", HEADLINE}
    unknown = wanted - {label for label, _ in MODES}
    if unknown:
        raise SystemExit(f"unknown modes {sorted(unknown)}; known: {', '.join(label for label, _ in MODES)}")
    return [(label, extra) for label, extra in MODES if not labels or label in wanted]


def compare(profile_name, steps, run, spec, labels=""):
    from testbed.requirements import bench_needs

    bench_needs("netns", "bench/train_dp.py --profile")
    modes, results = pick(labels), {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        with shaped_link(tmp, profile_name) as link:
            # Each mode's two runs back to back, their order alternating: the machine's load drifts.
            for k, (label, extra) in enumerate(modes):
                for where in ((profile_name, "loopback") if k % 2 == 0 else ("loopback", profile_name)):
                    results[label, where] = one(tmp, label, extra, steps, run, link if where != "loopback" else None)
                    print(f"{label} over {where}: done", flush=True)
        losses = dict(zip(results, final_loss([r[2] for r in results.values()], spec)))
    report(results, losses, profile_name, steps, modes)


def report(results, losses, profile_name, steps, modes):
    def wall(events):
        return [e for e in events if e["event"] == "step"][-1]["elapsed_s"]

    def done(events):
        return next(e for e in events if e["event"] == "done")

    ddp_link = results["ddp", profile_name][1]
    print(f"2 ranks, {steps} steps, the same data, samples and seed; link {profile_name} (lab bridge) and loopback")
    print(f"{'mode':<16} {'link MiB':>9} {'payload MiB':>11} {'syncs':>5} {'sync s':>7} {'wall s ' + profile_name:>14} "
          f"{'wall s loop':>11} {'link/loop':>9} {'final loss':>10}")
    for label, _ in modes:
        events, moved, _ = results[label, profile_name]
        loop_events = results[label, "loopback"][0]
        d = done(events)
        sync_s = f"{d['sync_s']:.1f}" if label != "ddp" else "-"  # DDP's all-reduces overlap its backward pass
        print(f"{label:<16} {moved / 2**20:>9.2f} {d['bytes_total'] / 2**20:>11.2f} {d['syncs']:>5} {sync_s:>7} "
              f"{wall(events):>14.1f} {wall(loop_events):>11.1f} {wall(events) / wall(loop_events):>9.2f} "
              f"{losses[label, profile_name]:>10.4f}")
    for label, _ in modes[1:]:
        print(f"{label}: bytes vs DDP {results[label, profile_name][1] / ddp_link:.4f}, final loss vs DDP "
              f"{losses[label, profile_name] / losses['ddp', profile_name]:.4f}, wall over {profile_name} vs loopback "
              f"{wall(results[label, profile_name][0]) / wall(results[label, 'loopback'][0]):.2f}")
    print(f"local_bytes_vs_ddp={results[HEADLINE, profile_name][1] / ddp_link:.4f}")
    print(f"local_loss_vs_ddp={losses[HEADLINE, profile_name] / losses['ddp', profile_name]:.4f}")
