"""The `link_bitrate` key and `rngrid transport --link-bitrate`: named for
what they do on rns 0.9.4 (tell RNS the link's speed: MTU, announce pacing),
never passed off as a rate limit; the old `bitrate` key is a clear error."""

import pytest

from reticulum_grid.node import config
from reticulum_grid.node.rnsnet import config_text
from tests.conftest import rngrid


def write(path, network):
    config.write_tower(path, "bitrate-test", {}, network=network)
    return path


def test_old_bitrate_key_is_a_clear_error(tmp_path):
    path = write(tmp_path / "tower.toml", {"listen": "", "bitrate": 1200})
    with pytest.raises(config.ConfigError, match="link_bitrate.*never limited"):
        config.load_tower(path)


def test_link_bitrate_reaches_every_rns_interface(tmp_path):
    path = write(tmp_path / "tower.toml", {"listen": "127.0.0.1:4000", "connect": ["127.0.0.1:4001"],
                                           "link_bitrate": 1200})
    net = config.load_tower(path).network
    text = config_text(listen=net.listen, connect=net.connect, link_bitrate=net.link_bitrate)
    assert text.count("bitrate = 1200") == 2


def test_transport_help_says_it_does_not_limit(tmp_path):
    result = rngrid("transport", "--help", home=tmp_path)
    assert "--link-bitrate" in result.stdout and "does not limit the rate" in " ".join(result.stdout.split())
