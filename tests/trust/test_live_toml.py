"""node/live_toml.py: a running tower or gateway sees its edited config file
at its next look, keeps the last good value when the file stops parsing, and
tells two writes apart within one tick of the file system's clock."""

import os
import tomllib

from reticulum_grid.node.config_values import ConfigError
from reticulum_grid.node.live_toml import LiveToml


def load(path):
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(str(e)) from None


def replace_file(path, text, mtime_ns=None):
    """Write as node/config.py write_toml does (a new file moved over the old), optionally stamping one mtime."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    if mtime_ns is not None:
        os.utime(tmp, ns=(mtime_ns, mtime_ns))
    os.replace(tmp, path)


def test_an_edit_is_seen_and_a_broken_file_keeps_the_last_good_value(tmp_path):
    path = tmp_path / "tower.toml"
    replace_file(path, "[allow]\na = ['infer']\n")
    errors = []
    live = LiveToml(path, load, on_error=errors.append)
    assert live.value == {"allow": {"a": ["infer"]}} and not live.fresh()
    replace_file(path, "[allow]\na = ['infer', 'train']\n")
    assert live.value == {"allow": {"a": ["infer", "train"]}}
    replace_file(path, "[allow\n")
    assert live.value == {"allow": {"a": ["infer", "train"]}} and len(errors) == 1
    replace_file(path, "[allow]\n")
    assert live.value == {"allow": {}}


def test_two_writes_with_one_mtime_are_told_apart(tmp_path):
    path = tmp_path / "client.toml"
    stamp = 1_700_000_000_000_000_000
    replace_file(path, "[trust]\n", mtime_ns=stamp)
    live = LiveToml(path, load)
    replace_file(path, "[trust]\nt = 'one'\n", mtime_ns=stamp)  # same mtime: the inode and size differ
    assert live.value == {"trust": {"t": "one"}}
