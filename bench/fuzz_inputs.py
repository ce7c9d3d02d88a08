"""What bench/fuzz.py feeds the decoders: hypothesis strategies of wire and disk input.

Hand-made strategies for the request maps, manifests, TOML, datasets, HTTP
bodies and LXMF fields; and strategies derived from the contract: ``shaped``
turns a valid sample (a packed Channel message, an end usage, caps or
caps/full read through their decoders, which notes every key they read) into
values shaped like it with a few parts changed, so a new message, usage or
field is fuzzed with no edit here.
"""

import dataclasses
import importlib
import json
import math

import msgpack
from hypothesis import strategies as st

from announce import caps as capscodec
from announce import capsfull
from announce.capsfull import CapsFull
from links import usage
from reticulum_grid.training import request as train_request

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


def mutated(valid):
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


def bytes_from(valid):
    """Bytes for a decoder: garbage, msgpack of anything, mutations of valid input."""
    return st.one_of(st.binary(max_size=300), VALUES.map(_pack), valid.map(_pack), mutated(valid.map(_pack)))


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


def manifests():
    def build(args):
        chunk_size, sizes = args
        return [1, chunk_size, sum(sizes), [[b"\x00" * 32, n] for n in sizes]]
    return st.tuples(st.integers(0, 1 << 27), st.lists(st.integers(-1, 1 << 21), max_size=5)).map(build)


_toml_value = st.one_of(st.integers(-(1 << 63), (1 << 63) - 1), st.text(max_size=20), st.booleans(),
                        st.floats(allow_nan=False), st.lists(st.text(max_size=10), max_size=3))
_toml_key = st.sampled_from(["name", "network", "listen", "connect", "models", "path", "n_ctx", "threads",
                             "n_gpu_layers", "allow", "limits", "queue_depth", "announce", "heartbeat_s",
                             "floor_s", "lxmf", "propagation_node", "unreferenced_s", "bitrate", "transport"])


def toml_texts():
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


def json_of(value):
    return json.dumps(value, default=lambda o: o.hex() if isinstance(o, bytes) else str(o))


_line = st.one_of(VALUES.map(json_of),
                  st.fixed_dictionaries({"text": VALUES}).map(json_of),
                  st.fixed_dictionaries({"messages": st.lists(st.fixed_dictionaries(
                      {"role": st.sampled_from(["user", "assistant", "x"]), "content": VALUES}), max_size=3)}
                  ).map(json_of),
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
    (capscodec.VoiceCap("whisper", "stt", "en", 31.5, 1), capscodec.VoiceCap("espeak", "tts", "", 300.0, 2)), True,
    at_ms=1_764_770_000_123)
SAMPLE_CAPS_MAP = msgpack.unpackb(capscodec.encode(SAMPLE_CAPS, budget=1 << 20))
CAPS_READS = keys_read(capscodec.from_map, SAMPLE_CAPS_MAP)
CAPS = shaped(SAMPLE_CAPS_MAP, CAPS_READS)

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


def message_sample(cls):
    return msgpack.unpackb(cls().pack(), raw=False)


# The voice streams' end usages register in links/usage.py when their module loads.
importlib.import_module("reticulum_grid.voice.request")


def usage_sample(cls):
    """An end usage map of ``cls`` with each field set to a value of its type (tagged)."""
    values = {int: 3, float: 1.5, str: "x", bytes: b"x"}
    return {usage.USAGE_KIND: cls.KIND, **{f.name: values.get(f.type, ["ab" * 16]) for f in dataclasses.fields(cls)
                                           if f.type in values or f.type == tuple[str, ...]}}
