"""Fuzz every decoder that reads the wire or the disk, with hypothesis.

Each target feeds generated input (bench/fuzz_inputs.py) to one decoder: random bytes, msgpack of
random values, and valid messages with a few bytes changed, so the input
reaches past the msgpack layer into the field checks. The contract's own
tables make the targets: one per Channel message type in links/protocol.py's
MESSAGE_TYPES (``message:<class>``, its input shaped like a packed default
instance), one per end usage shape links/usage.py knows (``usage:<kind>``),
and the caps and caps/full keys their decoders read (found by reading a full
sample through them), so a new message, usage or field is fuzzed with no edit
here. A decoder may only
raise its documented error (CapsError, WireError, ProtocolError,
ManifestError, ConfigError, DatasetError, the gateway's ApiError(400));
anything else is an uncaught
exception, and an input that takes longer than HANG_S is a hang. The run
goes on after a failure, so the counts are totals.

    python bench/fuzz.py [--examples 100000] [--only NAME ...]

Prints one line per decoder (inputs, uncaught exceptions, hangs, the first
failing input of each kind) and last ``fuzz_ok=<clean decoders>/<decoders>``.
tests/wire/test_fuzz.py runs the same targets with a few hundred inputs each.
"""

import argparse
import collections
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

# bench/ is sys.path[0] when run as a script; its modules must not shadow the packages,
# and the checkout's root holds bench.fuzz_inputs.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.markup import escape  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings, strategies as st  # noqa: E402

from announce import caps as capscodec  # noqa: E402
from announce.capsfull import CapsFull  # noqa: E402
from links import manifest as mf, protocol, usage, wire  # noqa: E402
from links.channel import ProtocolError  # noqa: E402
from links.jobevents import JobEvent  # noqa: E402
from links.wire import WireError  # noqa: E402
from reticulum_grid.client import pieces  # noqa: E402
from reticulum_grid.client.models import TowerModel  # noqa: E402
from reticulum_grid.gateway import ollama_api, openai_api, responses_api  # noqa: E402
from reticulum_grid.gateway.errors import ApiError  # noqa: E402
from reticulum_grid.inference import request as inference_request  # noqa: E402
from reticulum_grid.node import config  # noqa: E402
from reticulum_grid.store.names import parse_blob_id  # noqa: E402
from reticulum_grid.tower import blobs as tower_blobs  # noqa: E402
from reticulum_grid.training import checkpoint, datasets, notify, request as train_request  # noqa: E402
from bench.fuzz_inputs import (  # noqa: E402
    BLOBS, CAPS, CAPS_FULL, DATASET, EVENT, HTTP_BODIES, INFERENCE, LOGPROBS, LXMF, RESPONSE, TOWER_MODELS, TRAIN,
    VALUES, bytes_from, json_of, manifests, message_sample, mutated, shaped, toml_texts, usage_sample)

#: An input that takes longer than this is a hang (seconds of CPU time, so
#: a machine busy with other work does not turn slow inputs into hangs).
HANG_S = 2.0
#: Inputs drawn per hypothesis example, and for targets whose inputs are too
#: big to draw ten at once (hypothesis would discard most examples as overruns).
BATCH = 10
BATCHES = {"train_request": 1, "caps_full": 1, "tower_models": 1}

# -- targets ---------------------------------------------------------------
def _unpack(cls):
    def run(data):
        cls().unpack(data)
    return run


def _usage_of(cls):
    def run(raw):
        usage.decode_usage(raw, cls).to_map()
    return run


def _inference(data):
    inference_request.parse(wire.unpack_map(data))


def _train(request, scratch):
    dataset = scratch / "data.jsonl"
    if not dataset.exists():
        dataset.write_text('{"text": "hello"}\n')
    train_request.TrainRequest.from_map(request).check_on({"q_proj", "v_proj"}, dataset)


def _blobs(request):
    for schema in (tower_blobs.PUSH, tower_blobs.PULL):
        try:
            r = wire.validate(request, schema)
            if "blob_id" in r:
                parse_blob_id(r["blob_id"])
        except WireError:
            pass


def _event(data):
    event = JobEvent()
    event.unpack(data)
    json.dumps(event.event)  # `rngrid jobs watch --json` prints events as they came


def _tower_models(reply):
    """A tower's caps/full rows as Grid.tower_models reads them."""
    full = CapsFull.from_map(reply)
    return [TowerModel.of("t", blob) for blob in full.blobs]


def _http_body(body):
    """Every route parser of the gateway on one body: each may only refuse with ApiError(400)."""
    parsers = (lambda b: openai_api.parse(b, True, {"m"}), lambda b: openai_api.parse(b, False, {"m"}),
               openai_api.parse_embeddings, lambda b: responses_api.parse(b, {"m"}), ollama_api.parse_chat,
               ollama_api.parse_generate, ollama_api.parse_embed, lambda b: ollama_api.parse_embed(b, legacy=True))
    for parse in parsers:
        try:
            parse(body)
        except ApiError as e:
            if e.status != 400:
                raise


def _lxmf(args):
    entry = notify.inbox_entry(*args)
    json.dumps(entry)  # `rngrid inbox --json` prints it; rich prints title and content
    escape(entry["title"]), escape(entry["content"])


def _config(text, scratch):
    path = scratch / "tower.toml"
    path.write_text(text)
    try:
        config.load_tower(path)
    finally:
        config.load_network(path)


def _dataset(data, scratch):
    path = scratch / "data.jsonl"
    path.write_bytes(data)
    datasets.read_examples(path)


def targets(scratch):
    """name -> (strategy, function, the errors it may raise)."""
    scratch = Path(scratch)
    return {
        "caps": (bytes_from(CAPS), capscodec.decode, (capscodec.CapsError,)),
        "caps_full": (CAPS_FULL, CapsFull.from_map, (capscodec.CapsError,)),
        "inference_request": (bytes_from(INFERENCE), _inference, (WireError,)),
        "train_request": (TRAIN, lambda r: _train(r, scratch), (WireError,)),
        "blob_requests": (BLOBS, _blobs, ()),
        "response": (bytes_from(RESPONSE), wire.parse_response, (WireError,)),
        "job_events": (bytes_from(EVENT), _event, (ProtocolError,)),
        "manifest": (bytes_from(manifests()), mf.unpack, (mf.ManifestError,)),
        "lxmf_fields": (LXMF, _lxmf, ()),
        "config": (toml_texts(), lambda t: _config(t, scratch), (config.ConfigError,)),
        "dataset": (DATASET, lambda d: _dataset(d, scratch), (datasets.DatasetError,)),
        "tower_models": (TOWER_MODELS, _tower_models, (capscodec.CapsError,)),
        "logprobs": (LOGPROBS, pieces.logprobs, ()),
        "gateway_bodies": (HTTP_BODIES, _http_body, ()),
        "checkpoint": (_checkpoints(), checkpoint.unpack, (checkpoint.CheckpointError,)),
        **contract_targets(),
    }


def contract_targets():
    """A target per Channel message type of links/protocol.py (``message:<class>``)
    and per end usage shape of links/usage.py (``usage:<kind>``)."""
    out = {f"message:{cls.__name__}": (bytes_from(shaped(message_sample(cls))), _unpack(cls), (ProtocolError,))
           for cls in protocol.all_message_types()}
    for kind, cls in usage.EndUsage.kinds().items():
        out[f"usage:{kind}"] = (shaped(usage_sample(cls)) | VALUES, _usage_of(cls), (WireError,))
    return out


def _checkpoints():
    """Bytes as rank 0 sends a training state to the other ranks (training/checkpoint.py): garbage,
    mutations of a real one, and real safetensors files whose tree is any JSON."""
    import torch
    from safetensors.torch import save
    state = {"adapter": {"w": torch.arange(6.0).reshape(2, 3)}, "rng": torch.get_rng_state()[:16],
             "optimizer": {"state": {0: {"step": torch.tensor(3.0)}},
                           "param_groups": [{"betas": (0.9, 0.999), "lr": 1e-3, "params": [0]}]}, "step": 3}
    valid = st.just(checkpoint.pack(state))
    trees = VALUES.map(json_of).map(lambda tree: save({"t0": torch.zeros(2)}, metadata={"tree": tree}))
    return st.one_of(st.binary(max_size=300), valid, mutated(valid), trees)


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def fuzz(name, strategy, function, allowed, examples, seed=None, progress=0):
    """Run ``function`` on ``examples`` generated inputs. Returns a dict:
    inputs, uncaught (count), hangs (count), first (repr of a failing input per
    exception type). ``progress``: print the counts every that many inputs."""
    stats = {"inputs": 0, "uncaught": 0, "hangs": 0, "first": {}}

    # Several inputs per hypothesis example: its per-example bookkeeping costs
    # more than drawing an input, so this runs ~BATCH times faster.
    batch = BATCHES.get(name, BATCH)

    @settings(max_examples=max(1, -(-examples // batch)), database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), derandomize=seed is not None)
    @given(st.lists(strategy, min_size=batch, max_size=batch))
    def run(values):
        for value in values:
            if stats["inputs"] < examples:
                _one(value)

    def _one(value):
        stats["inputs"] += 1
        if progress and stats["inputs"] % progress == 0:
            print(f"    {name}: {stats['inputs']} inputs, {stats['uncaught']} uncaught, {stats['hangs']} hangs so far",
                  flush=True)
        signal.setitimer(signal.ITIMER_VIRTUAL, HANG_S)
        try:
            function(value)
        except allowed:
            pass
        except Hang:
            stats["hangs"] += 1
            stats["first"].setdefault("hang", repr(value)[:300])
        except Exception as e:
            stats["uncaught"] += 1
            stats["first"].setdefault(type(e).__name__, f"{e!s:.120} <- {value!r:.300}")
        finally:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)

    previous = signal.signal(signal.SIGVTALRM, _alarm)
    try:
        run()
    finally:
        signal.signal(signal.SIGVTALRM, previous)
    return stats


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=100_000, help="generated inputs per decoder")
    parser.add_argument("--only", nargs="*", default=None, help="decoders to fuzz (default: all)")
    args = parser.parse_args()
    clean = 0
    with tempfile.TemporaryDirectory(prefix="rngrid-fuzz-") as scratch:
        chosen = {k: v for k, v in targets(scratch).items() if not args.only or k in args.only}
        totals = collections.Counter()
        for name, (strategy, function, allowed) in chosen.items():
            started = time.monotonic()
            stats = fuzz(name, strategy, function, allowed, args.examples, progress=10_000)
            totals.update(inputs=stats["inputs"], uncaught=stats["uncaught"], hangs=stats["hangs"])
            clean += not stats["uncaught"] and not stats["hangs"]
            print(f"{name:18} inputs={stats['inputs']:>7} uncaught={stats['uncaught']} hangs={stats['hangs']} "
                  f"({time.monotonic() - started:.0f} s)", flush=True)
            for kind, example in stats["first"].items():
                print(f"    first {kind}: {example}", flush=True)
        print(f"total inputs={totals['inputs']} uncaught={totals['uncaught']} hangs={totals['hangs']}")
        print(f"fuzz_ok={clean}/{len(chosen)}")
    return 0 if clean == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
