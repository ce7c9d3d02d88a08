"""Fuzz every decoder that reads the wire or the disk, with hypothesis.

Each target feeds generated input to one decoder: random bytes, msgpack of
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
tests/test_fuzz.py runs the same targets with a few hundred inputs each.
"""

import argparse
import collections
import dataclasses
import importlib
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
from announce import capsfull  # noqa: E402
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

#: An input that takes longer than this is a hang (seconds of CPU time, so
#: a machine busy with other work does not turn slow inputs into hangs).
HANG_S = 2.0
#: Inputs drawn per hypothesis example, and for targets whose inputs are too
#: big to draw ten at once (hypothesis would discard most examples as overruns).
BATCH = 10
BATCHES = {"train_request": 1, "caps_full": 1, "tower_models": 1}

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


# -- strategies derived from the contract ------------------------------------
# Channel messages come from links/protocol.py's registry, end usages from
# links/usage.py's, and the keys of caps and caps/full from what their decoders
# read: a message, usage or field added there is fuzzed here with no edit.
class _Reads(dict):
    """A map that notes each key a decoder reads from it (and from the maps inside it), by path."""

    def __init__(self, raw, seen, path=()):
        super().__init__({k: _noting(v, seen, path + (k,)) for k, v in raw.items()})
        self.seen, self.path = seen, path

    def get(self, key, default=None):
        self.seen.add(self.path + (key,))
        return super().get(key, default)

    def __getitem__(self, key):
        self.seen.add(self.path + (key,))
        return super().__getitem__(key)


def _noting(value, seen, path):
    if isinstance(value, dict):
        return _Reads(value, seen, path)
    if isinstance(value, list):
        return [_noting(v, seen, path + ("*",)) for v in value]
    return value


def keys_read(decode, sample):
    """The key paths ``decode`` reads from the map ``sample`` (a valid one reads them all)."""
    seen = set()
    decode(_Reads(sample, seen))
    return seen


def _mostly(valid, changed):
    """``valid`` 15 times in 16: a generated value has a few parts changed and
    reaches the checks behind the first one."""
    return st.one_of(*[valid.map(_same) for _ in range(15)], changed)  # distinct objects: one_of would merge them


def _same(value):
    return value


def _leaf(value):
    """The value itself (mostly), another of its type, or anything."""
    if isinstance(value, bool):
        other = st.booleans()
    elif isinstance(value, int):
        other = _ints | _small
    elif isinstance(value, float):
        other = st.floats() | _small
    elif isinstance(value, str):
        other = _text
    elif isinstance(value, bytes):
        other = st.binary(max_size=max(40, len(value) + 4))
    else:
        other = VALUES
    return _mostly(st.just(value), other | VALUES)


def shaped(sample, reads=frozenset(), path=()):
    """Values shaped like ``sample`` (a decoded msgpack value) with a few parts
    changed: its maps keep their keys and may gain the ``reads`` at that path
    (keys a decoder reads that the sample lacks), its lists keep their item
    shape; any part may become another value of its type or anything."""
    if isinstance(sample, dict):
        keys = dict.fromkeys([*sample, *(p[-1] for p in reads if p[:-1] == path)])
        parts = {k: shaped(sample[k], reads, path + (k,)) if k in sample else VALUES for k in keys}
        kept = st.fixed_dictionaries({k: v for k, v in parts.items() if k in sample},
                                     optional={k: v for k, v in parts.items() if k not in sample})
        return _mostly(kept, _map_of(parts) | VALUES)
    if isinstance(sample, (list, tuple)):
        items = [shaped(v, reads, path + ("*",)) for v in sample]
        other = st.lists(st.one_of(*items), max_size=len(items) + 2) if items else st.lists(VALUES, max_size=4)
        return _mostly(st.tuples(*items).map(list), other | VALUES)
    return _leaf(sample)


#: Caps with every field set (announce/caps.py): what a busy tower with voice engines announces.
SAMPLE_CAPS = capscodec.Caps(
    "tower-a", capscodec.Hardware("cuda", "RTX 5090", 32607, 30000, 64000, 50000, 1),
    (capscodec.ModelCap("smollm2-135m", b"\x01\x02\x03\x04", True, 3, 2), capscodec.ModelCap("disk", b"abcd")),
    (capscodec.AdapterCap("lora-a", b"\x05\x06\x07\x08"),), capscodec.Load(1, 1, 2), 42.5, 900, 8192,
    (capscodec.VoiceCap("whisper", "stt", "en", 31.5, 1), capscodec.VoiceCap("espeak", "tts", "", 300.0, 2)), True)
_SAMPLE_CAPS_MAP = msgpack.unpackb(capscodec.encode(SAMPLE_CAPS, budget=1 << 20))
_CAPS_READS = keys_read(capscodec.from_map, _SAMPLE_CAPS_MAP)
CAPS = shaped(_SAMPLE_CAPS_MAP, _CAPS_READS)

#: A caps/full reply with every field set (announce/capsfull.py).
SAMPLE_CAPS_FULL = capsfull.CapsFull(
    caps=SAMPLE_CAPS,
    blobs=(capsfull.BlobFacts("smollm2-135m", b"\x01" * 32, 1 << 27, "model", True, on_gpu=True, gpu_mib=900,
                              host_mib=10, gpu_model_mib=800, host_model_mib=5, vram_mib=950, slots=4, slots_free=3,
                              n_ctx=4096, need_mib=1200, n_layers=30, embedding=576, reading=True,
                              gguf=capsfull.ModelSummary("llama", 134_515_008, "Q4_1", 8192, 576, 30, 0, "SmolLM2")),
           capsfull.BlobFacts("", b"\x02" * 32, 12, "dataset")),
    gpus=(capsfull.GpuInfo(index=0, name="RTX 5090", total_mib=32607, free_mib=30000),),
    voice=(capsfull.VoiceInfo("whisper", "stt", "en", 31.5, True, "none"),),
    dataplane=True, you=capsfull.Caller(identity="ab" * 16, roles=("infer", "train")))
_SAMPLE_FULL_MAP = SAMPLE_CAPS_FULL.to_map()
# Its packed caps are mostly the sample's (the caps target fuzzes what is inside them).
CAPS_FULL = shaped(_SAMPLE_FULL_MAP, keys_read(CapsFull.from_map, _SAMPLE_FULL_MAP))
#: caps/full's rows as a tower sends them, beside valid caps (Grid.tower_models reads them).
TOWER_MODELS = CAPS_FULL.map(lambda reply: {**reply, "caps": _SAMPLE_FULL_MAP["caps"]}
                             if isinstance(reply, dict) else reply)


def _message_sample(cls):
    return msgpack.unpackb(cls().pack(), raw=False)


# The voice streams' end usages register in links/usage.py when their module loads.
importlib.import_module("reticulum_grid.voice.request")


def _usage_sample(cls):
    """An end usage map of ``cls`` with each field set to a value of its type (tagged)."""
    values = {int: 3, float: 1.5, str: "x", bytes: b"x"}
    return {usage.USAGE_KIND: cls.KIND, **{f.name: values.get(f.type, ["ab" * 16]) for f in dataclasses.fields(cls)
                                           if f.type in values or f.type == tuple[str, ...]}}


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
        "caps": (_bytes_from(CAPS), capscodec.decode, (capscodec.CapsError,)),
        "caps_full": (CAPS_FULL, CapsFull.from_map, (capscodec.CapsError,)),
        "inference_request": (_bytes_from(INFERENCE), _inference, (WireError,)),
        "train_request": (TRAIN, lambda r: _train(r, scratch), (WireError,)),
        "blob_requests": (BLOBS, _blobs, ()),
        "response": (_bytes_from(RESPONSE), wire.parse_response, (WireError,)),
        "job_events": (_bytes_from(EVENT), _event, (ProtocolError,)),
        "manifest": (_bytes_from(_manifest()), mf.unpack, (mf.ManifestError,)),
        "lxmf_fields": (LXMF, _lxmf, ()),
        "config": (_toml(), lambda t: _config(t, scratch), (config.ConfigError,)),
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
    out = {f"message:{cls.__name__}": (_bytes_from(shaped(_message_sample(cls))), _unpack(cls), (ProtocolError,))
           for cls in protocol.all_message_types()}
    for kind, cls in usage.EndUsage.kinds().items():
        out[f"usage:{kind}"] = (shaped(_usage_sample(cls)) | VALUES, _usage_of(cls), (WireError,))
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
