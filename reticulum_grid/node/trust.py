"""Which towers this client trusts: the ``[trust]`` table of ``client.toml``.

A client sends prompts, datasets, adapters and shard plans only to towers it
trusts, named by the tower's identity hash (``rngrid id --config tower.toml``
on the tower; ``rngrid tower`` prints the exact ``rngrid trust`` line)::

    [trust]
    any = false                                   # true: use every tower heard (a public mesh)
    "5e1c0a7d2b8f4e6a9c3d1f0b7a2e4c6d" = "big-tower"   # identity hash = what this client calls it
    "0b7a2e4c6d5e1c0a7d2b8f4e6a9c3d1f" = ""            # "": the name the tower announces

A tower's name is what its entry says, not what its announce says: a stranger
announcing "big-tower" is not big-tower. RNS checks every announce's
signature, and a tower's destination hash derives from its identity (app
``rngrid``, aspect ``tower``), so trusting the identity hash pins the
destination too. Towers heard but not trusted are kept apart (``rngrid
towers`` lists them) and never used. ``any = true`` uses them as well (with
a warning): their names are then only their word, and a trusted tower wins
a name both claim.

Bad values raise ConfigError naming the key.
"""

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import RNS
import tomlkit

from announce.announcer import APP_NAME, TOWER_ASPECT
from announce.caps import Caps
from announce.unseen import name_problem
from reticulum_grid.node.config import NAME_MAX_BYTES, ConfigError, identity_hex, read_toml, remove_entry, write_toml
from reticulum_grid.node.live_toml import LiveToml, Stamp

log = logging.getLogger("rngrid.trust")

TABLE = "trust"


@dataclass(frozen=True)
class Trust:
    """``towers``: {identity hash hex: name ("" = the announced one)}; ``any``: use untrusted towers too."""
    towers: dict[str, str] = field(default_factory=dict)
    any: bool = False

    def destinations(self) -> dict[bytes, str]:
        """{tower destination hash (16 bytes): name} for the trusted identities."""
        return {tower_destination(h): name for h, name in self.towers.items()}

    def lxmf_sources(self) -> dict[str, str]:
        """{LXMF delivery hash hex: name} of the trusted towers (the sender of their job notifications)."""
        return {RNS.Destination.hash(bytes.fromhex(h), "lxmf", "delivery").hex(): name for h, name in self.towers.items()}


def tower_destination(identity_hash_hex: str) -> bytes:
    """The destination hash (16 bytes) a tower with this identity hash serves on."""
    return RNS.Destination.hash(bytes.fromhex(identity_hash_hex), APP_NAME, TOWER_ASPECT)


def load(path: str | os.PathLike[str]) -> Trust:
    """The ``[trust]`` table of the client config at ``path`` (a missing file trusts nothing)."""
    path = Path(path)
    table = read_toml(path).get(TABLE, {}) if path.exists() else {}
    if not isinstance(table, dict):
        raise ConfigError(f"[{TABLE}] must be a table")
    any_tower = table.get("any", False)
    if not isinstance(any_tower, bool):
        raise ConfigError(f"{TABLE}.any must be true or false")
    towers: dict[str, str] = {}
    for key, name in table.items():
        if key == "any":
            continue
        if not isinstance(name, str):
            raise ConfigError(f"{TABLE}.{key} must be the tower's name (a string; \"\" for its announced one)")
        towers[identity_hex(key)] = check_name(name) if name else ""
    return Trust(towers, any_tower)


def check_name(name: str) -> str:
    """``name`` if it may name a tower here: 1..32 bytes of printable text, not a hash. Raises ConfigError."""
    if not name or len(name.encode()) > NAME_MAX_BYTES:
        raise ConfigError(f"a tower name is 1..{NAME_MAX_BYTES} bytes, got {name!r}")
    if (problem := name_problem(name)) is not None:
        raise ConfigError(f"{problem} ({name!a})")
    if len(name) == 32 and all(c in "0123456789abcdef" for c in name.lower()):
        raise ConfigError(f"{name!r} looks like a hash; give the tower a name")
    return name


def trust(path: str | os.PathLike[str], identity_hash: str, name: str | None = None) -> str:
    """Trust the tower with ``identity_hash``, called ``name`` (None or "": the
    name it announces). Returns the entry's name. Raises ConfigError when the
    name is another trusted tower's."""
    return trust_many(path, {identity_hash: name})[identity_hex(identity_hash)]


def trust_many(path: str | os.PathLike[str], towers: Mapping[str, str | None]) -> dict[str, str]:
    """Trust every tower of ``towers`` ({identity hash: name or None}) in one
    write of the client config at ``path``. Returns {identity hex: name}."""
    path = Path(path)
    doc = tomlkit.parse(path.read_text()) if path.exists() else tomlkit.document()
    table = doc.setdefault(TABLE, tomlkit.table())
    added: dict[str, str] = {}
    for identity_hash, name in towers.items():
        identity_hash, name = identity_hex(identity_hash), check_name(name) if name else ""
        taken = [k for k, v in table.items() if k != "any" and v == name and k != identity_hash]
        if name and taken:
            raise ConfigError(f"{taken[0]} is trusted as {name!r} already; choose another name or untrust it first")
        table[identity_hash] = added[identity_hash] = name
    path.parent.mkdir(parents=True, exist_ok=True)
    write_toml(path, doc)
    return added


def untrust(path: str | os.PathLike[str], identity_hash: str) -> bool:
    """Stop trusting a tower. Returns True if it was trusted."""
    identity_hash = identity_hex(identity_hash)
    path = Path(path)
    return path.exists() and remove_entry(path, TABLE, identity_hash)


class LiveTrust:
    """A client config's ``[trust]`` table, re-read when the file changes (so
    ``rngrid trust`` takes effect on a running gateway). A file that stops
    parsing keeps the last good table (and logs why). Vets tower table
    entries (announce.table.TowerTable's ``vet``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._file = LiveToml(path, load, on_error=lambda e: log.error("trust list not reloaded: %s", e))
        self._destinations = self._file.value.destinations()
        self._warned = False

    @property
    def version(self) -> Stamp:
        """Changes whenever the table does (re-reading the file if it changed)."""
        if self._file.fresh():
            self._destinations = self._file.value.destinations()
        return self._file.stamp

    @property
    def trust(self) -> Trust:
        self.version  # noqa: B018 (re-reads a changed file)
        return self._file.value

    def __call__(self, destination_hash: bytes, caps: Caps) -> tuple[Caps, bool] | None:
        """(caps named as the trust entry says, trusted?) for an announce or
        caps/full of ``destination_hash``; None for a tower not to be used."""
        trusted = self.trust  # the file as it is now
        name = self._destinations.get(destination_hash)
        if name is not None:
            return (replace(caps, name=name) if name else caps), True
        if not trusted.any:
            return None
        if not self._warned:
            self._warned = True
            log.warning("[trust] any = true: towers this client does not trust get prompts and data too")
        return caps, False
