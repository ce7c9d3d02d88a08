"""Every decoder of wire or disk input, fuzzed briefly (bench/fuzz.py runs the
same targets with 100,000 inputs each), and the inputs fuzzing found, kept as
regression tests."""

import importlib.util
import json
from pathlib import Path

import msgpack
import pytest

from bench import fuzz_inputs as INPUTS
from links.jobevents import JobEvent
from reticulum_grid.node import config
from reticulum_grid.training import datasets, notify

ROOT = Path(__file__).resolve().parents[2]
#: Inputs per decoder here; the bench run uses 100,000.
SHORT_PROFILE = 300


def _bench():
    spec = importlib.util.spec_from_file_location("rngrid_fuzz", ROOT / "bench" / "fuzz.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FUZZ = _bench()


@pytest.mark.parametrize("name", sorted(FUZZ.targets("/nonexistent")))
def test_decoder_survives_generated_input(name, tmp_path):
    strategy, function, allowed = FUZZ.targets(tmp_path)[name]
    stats = FUZZ.fuzz(name, strategy, function, allowed, SHORT_PROFILE, seed=0)
    assert stats["inputs"] >= SHORT_PROFILE // 2
    assert stats["uncaught"] == 0 and stats["hangs"] == 0, stats["first"]


def test_every_protocol_message_type_is_a_fuzz_target():
    """A message type added to links/protocol.py's registry is fuzzed with no edit to bench/."""
    from links import protocol
    names = set(FUZZ.targets("/nonexistent"))
    missing = [cls.__name__ for cls in protocol.all_message_types() if f"message:{cls.__name__}" not in names]
    assert not missing, f"message types not fuzzed: {missing}"
    assert {"message:TunnelOpen", "message:TunnelData", "message:TunnelClose"} <= names


def test_every_end_usage_shape_is_a_fuzz_target():
    from links.usage import EndUsage
    kinds = EndUsage.kinds()
    assert {"inference", "embeddings", "transcript", "speech"} <= set(kinds)
    names = set(FUZZ.targets("/nonexistent"))
    assert {f"usage:{kind}" for kind in kinds} <= names


def test_every_caps_key_the_decoders_read_is_fuzzed():
    """The caps strategy holds each key announce/caps.py's decoder reads, "vo" and "qf" included."""
    read = {path[0] for path in INPUTS.CAPS_READS}
    assert {"v", "n", "hb", "hw", "m", "qf", "a", "l", "t", "sh", "vo", "more"} <= read


def test_a_caps_key_the_sample_lacks_is_still_generated():
    """A field added to the decoder reaches the fuzzer before anyone adds it to bench/'s sample."""
    from hypothesis import Phase, find, settings
    sample = {k: v for k, v in INPUTS.SAMPLE_CAPS_MAP.items() if k != "vo"}
    # Found is enough: shrinking the map it found took 80x as long as finding it.
    found = find(INPUTS.shaped(sample, INPUTS.CAPS_READS), lambda m: isinstance(m, dict) and "vo" in m,
                 settings=settings(max_examples=2000, database=None, phases=[Phase.generate]))
    assert "vo" in found


def test_a_new_message_type_becomes_a_fuzz_target(monkeypatch):
    import RNS

    from links import protocol

    class Probe(RNS.MessageBase):
        MSGTYPE = 0x04FF

        def pack(self):
            return msgpack.packb([1, "x"])

        def unpack(self, raw):
            raise ValueError("not a ProtocolError: the fuzzer must count it")

    monkeypatch.setitem(protocol.MESSAGE_TYPES, "tunnel", (*protocol.MESSAGE_TYPES["tunnel"], Probe))
    strategy, function, allowed = FUZZ.targets("/nonexistent")["message:Probe"]
    stats = FUZZ.fuzz("message:Probe", strategy, function, allowed, 20, seed=0)
    assert stats["uncaught"] == stats["inputs"] > 0


# -- found by fuzzing -------------------------------------------------------------
def test_deeply_nested_dataset_line_is_a_dataset_error(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(datasets.DatasetError, match="line 1"):
        datasets.read_examples(path)


@pytest.mark.parametrize("text", [
    "network = 5", "limits = []", "lxmf = 1", "announce = 'x'", "models = 3", "allow = 1",
    "[models.m]\npath = 'x'\nn_ctx = -5", "[models.m]\npath = 'x'\nthreads = -1",
    "[limits]\nqueue_depth = -1", "[announce]\nfloor_s = nan", "[announce]\nheartbeat_s = -1",
    "[network]\nlisten = 5", "[network]\nconnect = [5]", "[allow]\n\"zz\" = ['infer']", "[limits]\nunreferenced_s = -1",
])
def test_bad_config_is_a_config_error(tmp_path, text):
    path = tmp_path / "tower.toml"
    path.write_text(text)
    with pytest.raises(config.ConfigError):
        config.load_tower(path)


def test_lxmf_message_of_any_shape_prints_as_json():
    entry = notify.inbox_entry(b"\xff\xfe title", b"\x80", {1: b"\x00", "x": [float("inf"), msgpack.ExtType(1, b"")]},
                               b"\x01\x02", float("nan"))
    assert entry["title"].endswith("title") and entry["timestamp"] is None
    json.dumps(entry)


def test_job_event_values_json_cannot_carry_are_made_text():
    event = JobEvent()
    event.unpack(msgpack.packb([7, {"type": "progress", "loss": b"\x01", "r": [b"\x02"]}], use_bin_type=True))
    assert json.loads(json.dumps(event.event)) == {"type": "progress", "loss": "01", "r": ["02"]}
