"""Fuzz every decoder that reads the wire or the disk, with hypothesis.

Each target feeds generated input to one decoder: random bytes, msgpack of
random values, and valid messages with a few bytes changed, so the input
reaches past the msgpack layer into the field checks. A decoder may only
raise its documented error (CapsError, WireError, ProtocolError,
ManifestError, ConfigError, DatasetError, the gateway's ApiError(400));
anything else is an uncaught
exception, and an input that takes longer than HANG_S is a hang. The run
goes on after a failure, so the counts are totals.

    python bench/fuzz.py [--examples 100000] [--only NAME ...]

Prints one line per decoder (inputs, uncaught exceptions, hangs, the first
failing input of each kind) and last ``fuzz_ok=<clean decoders>/<decoders>``.
tests/test_fuzz.py runs the same targets with a few hundred inputs each.
"""

import argparse
import collections
import json
import math
import signal
import sys
import tempfile
import time
from pathlib import Path

# bench/ is sys.path[0] when run as a script; its modules must not shadow the packages.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import msgpack  # noqa: E402
from rich.markup import escape  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings, strategies as st  # noqa: E402

from announce import caps as capscodec  # noqa: E402
from announce.capsfull import CapsFull  # noqa: E402
from links import manifest as mf, wire  # noqa: E402
from links.channel import ProtocolError  # noqa: E402
from links.chunks import ChunkCancel, ChunkData, ChunkError, ChunkRequest, TransferEnd, TransferProgress  # noqa: E402
from links.jobevents import JobEvent  # noqa: E402
from links.stream import StreamCancel, StreamEnd, StreamError, TokenChunk  # noqa: E402
from links.usage import StreamUsage  # noqa: E402
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

#: An input that takes longer than this is a hang (seconds of CPU time, so
#: a machine busy with other work does not turn slow inputs into hangs).
HANG_S = 2.0
#: Inputs drawn per hypothesis example, and for targets whose inputs are too
#: big to draw ten at once (hypothesis would discard most examples as overruns).
BATCH = 10
BATCHES = {"train_request": 1}

# -- strategies ------------------------------------------------------------
_ints = st.integers(-(1 << 63), (1 << 64) - 1)
_small = st.integers(-2, 70_000)
_scalar = st.one_of(st.none(), st.booleans(), _ints, _small, st.floats(), st.text(max_size=40),
                    st.binary(max_size=40))
VALUES = st.recursive(_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=6),
    st.dictionaries(st.one_of(st.text(max_size=8), _small), inner, max_size=6)), max_leaves=24)


def _pack(value):
    return msgpack.packb(value, use_bin_type=True)


def _mutated(valid):
    """Valid encodings with some bytes changed, cut or extended."""
    edits = st.lists(st.tuples(st.integers(0, 4096), st.integers(0, 255)), max_size=4)

    def apply(args):
        data, changes, cut = args
        data = bytearray(data)
        for at, byte in changes:
            if data:
                data[at % len(data)] = byte
        return bytes(data[:cut]) if cut is not None else bytes(data)
    return st.tuples(valid, edits, st.none() | st.integers(0, 4096)).map(apply)


def _bytes_from(valid):
    """Bytes for a decoder: garbage, msgpack of anything, mutations of valid input."""
    return st.one_of(st.binary(max_size=300), VALUES.map(_pack), valid.map(_pack), _mutated(valid.map(_pack)))


def _map_of(fields):
    """Maps with the schema's keys (plausible or random values) and sometimes others."""
    return st.fixed_dictionaries({}, optional={k: st.one_of(v, VALUES) for k, v in fields.items()}).flatmap(
        lambda d: st.dictionaries(st.text(max_size=6), VALUES, max_size=2).map(lambda extra: {**extra, **d}))


_id = st.integers(0, 1 << 33)
_text = st.text(max_size=60)
_alias = st.sampled_from(["smollm2-135m", "a", "x/y", "..", "", "\x00", "a" * 40]) | st.text(max_size=40)
_blob = st.binary(min_size=32, max_size=32) | st.binary(max_size=40)
_token_ids = st.lists(st.integers(-1, 1 << 32), max_size=8)

CAPS = st.fixed_dictionaries({
    "v": st.sampled_from([capscodec.SCHEMA_VERSION] * 2 + [0, 1, capscodec.SCHEMA_VERSION + 1, True]),
    "n": _alias, "hb": _small,
    "hw": st.tuples(st.sampled_from(["cpu", "cuda", "x"]), _text, _small, _small, _small, _small, _small).map(list),
    "m": st.lists(st.tuples(_alias, st.binary(min_size=3, max_size=5), st.integers(-1, 2)).map(list), max_size=4),
    "l": st.tuples(_small, _small, _small).map(list),
}, optional={"a": st.lists(st.tuples(_alias, st.binary(min_size=4, max_size=4)).map(list), max_size=3),
             "t": _ints, "sh": VALUES, "more": VALUES})

INFERENCE = _map_of({
    "model": _alias, "prompt": _text, "stream_id": _id, "max_tokens": _ints, "temperature": st.floats(),
    "top_p": st.floats(), "top_k": _ints, "min_p": st.floats(), "repeat_penalty": st.floats(), "seed": _ints,
    "stop": st.lists(_text, max_size=20), "adapter": _alias, "adapter_scale": st.floats(),
    "continue_tokens": _token_ids,
    "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "bot"]),
                                                "content": _text}) | VALUES, max_size=4)})

TRAIN = _map_of({**{k: VALUES for k in train_request.SCHEMA}, "base": _alias, "dataset": _alias,
                 "output_alias": _alias, "target_modules": st.lists(st.sampled_from(["q_proj", "lm_head", "zz"])),
                 "towers": st.lists(st.binary(max_size=20) | _text, max_size=20)})

BLOBS = _map_of({"blob_id": _blob | _text, "manifest": st.binary(max_size=80), "alias": _alias,
                 "kind": st.sampled_from(["model", "dataset", "x"]), "xfer_id": _id, "name": _alias,
                 "sources": st.lists(st.binary(min_size=16, max_size=16) | VALUES, max_size=20)})

RESPONSE = st.one_of(st.fixed_dictionaries({"ok": VALUES}, optional={"error": VALUES | st.fixed_dictionaries(
    {"code": _text, "message": _text, "retry_after": VALUES})}), VALUES)

STREAM = st.one_of(st.tuples(_id, _id, st.binary(max_size=30), _token_ids).map(list),
                   st.tuples(_id, _text, VALUES).map(list), st.tuples(_id, _text, _text).map(list),
                   st.tuples(_id).map(list))

CHUNK = st.one_of(st.tuples(_id, _blob, st.lists(_id, max_size=6)).map(list),
                  st.tuples(_id, _id, _id, st.binary(max_size=30)).map(list),
                  st.tuples(_id, st.integers(-2, 5), _text, _text).map(list),
                  st.tuples(_id, _id, _id).map(list),
                  st.tuples(_id, st.booleans(), _text, _text, VALUES).map(list))

EVENT = st.tuples(_id, _map_of({"type": st.sampled_from(["state", "progress", "end"]), "step": VALUES,
                                "loss": st.floats(), "state": _text, "error": _text})).map(list)


def _manifest():
    def build(args):
        chunk_size, sizes = args
        return [1, chunk_size, sum(sizes), [[b"\x00" * 32, n] for n in sizes]]
    return st.tuples(st.integers(0, 1 << 27), st.lists(st.integers(-1, 1 << 21), max_size=5)).map(build)


_toml_value = st.one_of(st.integers(-(1 << 63), (1 << 63) - 1), st.text(max_size=20), st.booleans(),
                        st.floats(allow_nan=False), st.lists(st.text(max_size=10), max_size=3))
_toml_key = st.sampled_from(["name", "network", "listen", "connect", "models", "path", "n_ctx", "threads",
                             "n_gpu_layers", "allow", "limits", "queue_depth", "announce", "heartbeat_s",
                             "floor_s", "lxmf", "propagation_node", "unreferenced_s", "bitrate", "transport"])


def _toml():
    """TOML text: tables and keys of the config (right or wrong types), or garbage."""
    def render(tables):
        lines = []
        for table, items in tables:
            if table:
                lines.append(f"[{table}]")
            for key, value in items:
                lines.append(f"{json.dumps(key)} = {_toml_literal(value)}")
        return "\n".join(lines)
    table_names = st.sampled_from(["", "network", "limits", "announce", "lxmf", "models.m", "models.\"a/b\"",
                                   "allow", "models"])
    tables = st.lists(st.tuples(table_names, st.lists(st.tuples(_toml_key | st.text(max_size=8), _toml_value),
                                                      max_size=5)), max_size=4)
    return st.one_of(tables.map(render), st.text(max_size=200))


def _toml_literal(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else "nan"
    if isinstance(value, list):
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    return json.dumps(value)


def _json(value):
    return json.dumps(value, default=lambda o: o.hex() if isinstance(o, bytes) else str(o))


_line = st.one_of(VALUES.map(_json),
                  st.fixed_dictionaries({"text": VALUES}).map(_json),
                  st.fixed_dictionaries({"messages": st.lists(st.fixed_dictionaries(
                      {"role": st.sampled_from(["user", "assistant", "x"]), "content": VALUES}), max_size=3)}
                  ).map(_json),
                  st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),
                  st.text(max_size=40))
DATASET = st.one_of(st.lists(_line, max_size=5).map(lambda lines: "\n".join(lines).encode()),
                    st.binary(max_size=200))

#: caps/full's blob rows as a tower sends them (announce/capsfull.py decodes them).
TOWER_MODELS = st.one_of(st.fixed_dictionaries({"blobs": st.lists(_map_of({
    "alias": _alias, "blob_id": _blob, "size": _ints, "kind": st.sampled_from(["model", "adapter", "x"]),
    "loaded": VALUES | st.booleans(), "on_gpu": VALUES, "gpu_mib": _ints, "host_mib": _small, "slots": _small,
    "slots_free": _ints, "n_ctx": _ints, "need_mib": _small, "n_layers": _small, "reading": st.booleans(),
    "gguf": _map_of({"architecture": _text, "parameters": _ints, "pooling": VALUES, "context_length": _small,
                     "name": VALUES})}) | VALUES, max_size=4)}), VALUES)
#: Whole caps/full replies: their caps, blob rows, GPUs, voice engines and the caller.
CAPS_FULL = st.one_of(_map_of({
    "caps": st.one_of(CAPS.map(_pack), _mutated(CAPS.map(_pack))), "blobs": TOWER_MODELS.map(
        lambda v: v.get("blobs") if isinstance(v, dict) else v),
    "gpus": st.lists(_map_of({"index": _small, "name": _text, "total_mib": _ints, "free_mib": _small}), max_size=3),
    "voice": st.lists(_map_of({"alias": _alias, "kind": st.sampled_from(["stt", "tts", "x"]), "language": _text,
                               "realtime": st.floats() | _small, "ready": VALUES, "error": _text}), max_size=3),
    "dataplane": VALUES, "you": _map_of({"identity": _text, "roles": st.lists(_text | VALUES, max_size=4)})}),
    VALUES)
#: A stream end's usage map as a tower sends it (links/usage.py decodes it).
USAGE = _map_of({"prompt_tokens": _ints, "completion_tokens": _small, "tower_ttft_s": st.floats(),
                 "tokens_per_s": st.floats() | _ints, "queued_s": st.floats(), "tower": _alias,
                 "cached_tokens": _ints, "draft_tokens": _small, "draft_accepted": _small,
                 "split": st.lists(st.text(max_size=32) | st.just("ab" * 16) | VALUES, max_size=4)}) | VALUES
#: Per-token probabilities as a tower's token chunk carries them (client/stream.py checks them).
LOGPROBS = st.lists(_map_of({"token": _text, "logprob": st.floats() | VALUES, "bytes": st.lists(_ints) | VALUES,
                             "top": st.lists(_map_of({"token": _text, "logprob": st.floats()}) | VALUES,
                                             max_size=3)}) | VALUES, max_size=4) | VALUES
_message = _map_of({"role": st.sampled_from(["user", "assistant", "tool", "system", "developer", "x"]),
                    "content": _text | VALUES, "tool_calls": VALUES | st.lists(_map_of({
                        "id": _text, "type": st.just("function"),
                        "function": _map_of({"name": _text, "arguments": _text | VALUES})}), max_size=2),
                    "tool_call_id": _text, "tool_name": _text, "images": VALUES, "name": VALUES})
#: Items of a Responses API ``input``.
_item = _map_of({"type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "x"]),
                 "role": st.sampled_from(["user", "assistant", "developer", "tool"]), "call_id": _text, "name": _text,
                 "arguments": _text, "output": _text | VALUES, "content": _text | st.lists(_map_of({
                     "type": st.sampled_from(["input_text", "output_text", "refusal", "input_image"]),
                     "text": _text}), max_size=2)})
#: Bodies of the gateway's OpenAI and Ollama routes (JSON a client sent).
HTTP_BODIES = st.one_of(_map_of({
    "model": _alias, "messages": st.lists(_message | VALUES, max_size=4), "prompt": _text | VALUES,
    "tools": st.lists(_map_of({"type": st.sampled_from(["function", "x"]), "function": _map_of({
        "name": _text, "parameters": VALUES})}) | VALUES, max_size=2),
    "tool_choice": VALUES | st.sampled_from(["auto", "none", "required"]),
    "response_format": VALUES | _map_of({"type": st.sampled_from(["json_object", "json_schema", "text"]),
                                         "json_schema": VALUES}),
    "logprobs": VALUES, "top_logprobs": VALUES, "stream": VALUES, "stream_options": VALUES,
    "max_tokens": _ints, "temperature": VALUES, "stop": VALUES, "seed": _ints, "n": VALUES,
    "options": _map_of({"temperature": VALUES, "num_predict": _ints, "stop": VALUES, "mirostat": VALUES,
                        "num_ctx": VALUES, "seed": VALUES}),
    "format": VALUES | st.just("json"), "input": VALUES | st.lists(_text, max_size=3) | st.lists(_item, max_size=3),
    "dimensions": VALUES, "encoding_format": VALUES, "system": VALUES, "raw": VALUES, "think": VALUES,
    "instructions": VALUES, "max_output_tokens": _ints, "previous_response_id": VALUES,
    "text": _map_of({"format": _map_of({"type": st.sampled_from(["text", "json_object", "json_schema", "x"]),
                                        "name": _text, "schema": VALUES})})}), VALUES)

LXMF = st.tuples(st.binary(max_size=40) | _text.map(str.encode), st.binary(max_size=80) | _text.map(str.encode),
                 VALUES | st.dictionaries(st.integers(0, 255) | _text, VALUES | st.binary(max_size=20), max_size=4),
                 st.binary(max_size=20), VALUES)


# -- targets ---------------------------------------------------------------
def _each(classes):
    def run(data):
        for cls in classes:
            try:
                cls().unpack(data)
            except ProtocolError:
                pass
    return run


def _inference(data):
    inference_request.parse(wire.unpack_map(data))


def _train(request, scratch):
    dataset = scratch / "data.jsonl"
    if not dataset.exists():
        dataset.write_text('{"text": "hello"}\n')
    train_request.parse(request, {"q_proj", "v_proj"}, dataset)


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


#: A caps blob every caps/full of the tower_models target carries (its rows are what is fuzzed).
_CAPS_BYTES = capscodec.encode(capscodec.Caps("t"))


def _tower_models(reply):
    """A tower's caps/full rows as Grid.tower_models reads them."""
    full = CapsFull.from_map({"caps": _CAPS_BYTES, **reply} if isinstance(reply, dict) else reply)
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
        "caps": (_bytes_from(CAPS), capscodec.decode, (capscodec.CapsError,)),
        "caps_full": (CAPS_FULL, CapsFull.from_map, (capscodec.CapsError,)),
        "inference_request": (_bytes_from(INFERENCE), _inference, (WireError,)),
        "train_request": (TRAIN, lambda r: _train(r, scratch), (WireError,)),
        "blob_requests": (BLOBS, _blobs, ()),
        "response": (_bytes_from(RESPONSE), wire.parse_response, (WireError,)),
        "stream_messages": (_bytes_from(STREAM), _each((TokenChunk, StreamEnd, StreamError, StreamCancel)), ()),
        "chunk_messages": (_bytes_from(CHUNK), _each((ChunkRequest, ChunkData, ChunkError, ChunkCancel,
                                                      TransferProgress, TransferEnd)), ()),
        "job_events": (_bytes_from(EVENT), _event, (ProtocolError,)),
        "manifest": (_bytes_from(_manifest()), mf.unpack, (mf.ManifestError,)),
        "lxmf_fields": (LXMF, _lxmf, ()),
        "config": (_toml(), lambda t: _config(t, scratch), (config.ConfigError,)),
        "dataset": (DATASET, lambda d: _dataset(d, scratch), (datasets.DatasetError,)),
        "tower_models": (TOWER_MODELS, _tower_models, (capscodec.CapsError,)),
        "logprobs": (LOGPROBS, pieces.logprobs, ()),
        "stream_usage": (USAGE, StreamUsage.from_map, ()),
        "gateway_bodies": (HTTP_BODIES, _http_body, ()),
        "checkpoint": (_checkpoints(), checkpoint.unpack, (checkpoint.CheckpointError,)),
    }


def _checkpoints():
    """Bytes as rank 0 sends a training state to the other ranks (training/checkpoint.py): garbage,
    mutations of a real one, and real safetensors files whose tree is any JSON."""
    import torch
    from safetensors.torch import save
    state = {"adapter": {"w": torch.arange(6.0).reshape(2, 3)}, "rng": torch.get_rng_state()[:16],
             "optimizer": {"state": {0: {"step": torch.tensor(3.0)}},
                           "param_groups": [{"betas": (0.9, 0.999), "lr": 1e-3, "params": [0]}]}, "step": 3}
    valid = st.just(checkpoint.pack(state))
    trees = VALUES.map(_json).map(lambda tree: save({"t0": torch.zeros(2)}, metadata={"tree": tree}))
    return st.one_of(st.binary(max_size=300), valid, _mutated(valid), trees)


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
