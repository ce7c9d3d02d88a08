"""One alias rule (announce/aliases.py) for a tower's config, its blob store
and the caps decoder: an alias one of them refuses, all refuse, and the
config says so at load, naming the key, instead of a WireError later."""

import msgpack
import pytest

from announce import caps
from links.wire import WireError
from reticulum_grid.node import config
from reticulum_grid.store.names import check_alias
from tests.discovery.test_caps import full_caps

GOOD = ["smollm2-135m", "coder-32b", "my-lora.peft", "qwen2.5:7b", "whisper-base"]
BAD = ["my model", "../x", "a/b", "..", ".hidden", "a..b", "deadbeef", "x" * 33, "modèle"]


def _caps_with(alias):
    raw = msgpack.unpackb(caps.encode(full_caps()), raw=False)
    raw["m"][0][0] = alias
    return msgpack.packb(raw, use_bin_type=True)


@pytest.mark.parametrize("alias", GOOD)
def test_a_good_alias_passes_everywhere(alias, tmp_path):
    assert check_alias(alias) == alias
    assert caps.decode(_caps_with(alias)).models[0].alias == alias
    config.write_tower(tmp_path / "tower.toml", "t", {alias: tmp_path / "m.gguf"})
    assert config.load_tower(tmp_path / "tower.toml").models[0].alias == alias


@pytest.mark.parametrize("alias", BAD)
def test_a_bad_alias_fails_everywhere(alias, tmp_path):
    with pytest.raises(WireError, match="alias"):
        check_alias(alias)
    with pytest.raises(caps.CapsError, match="alias"):
        caps.decode(_caps_with(alias))
    config.write_tower(tmp_path / "tower.toml", "t", {alias: tmp_path / "m.gguf"})
    with pytest.raises(config.ConfigError) as e:
        config.load_tower(tmp_path / "tower.toml")
    assert f"[models.{alias}]" in str(e.value) and "no spaces" in str(e.value), e.value


def test_a_voice_alias_follows_the_same_rule(tmp_path):
    config.write_tower(tmp_path / "tower.toml", "t", {}, voice={"my voice": {"kind": "tts"}})
    with pytest.raises(config.ConfigError, match=r"\[voice\.my voice\]"):
        config.load_tower(tmp_path / "tower.toml")
