"""A tower's ``[allow]`` table: granting and revoking roles in its config file
(comments kept), and the live view the tower checks each request against."""

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import RNS
import tomlkit

from announce.announcer import tower_destination_hash
from links.wire import Code, WireError
from reticulum_grid.node.config import (
    ROLES,
    TOWER_ROLES,
    ConfigError,
    TowerConfig,
    identity_hex,
    load_tower,
    remove_entry,
    write_toml,
)
from reticulum_grid.node.live_toml import LiveToml


def allow(path: str | os.PathLike[str], identity_hash_hex: str, roles: Iterable[str]) -> list[str]:
    """Grant ``roles`` to an identity in a tower config, keeping its comments.

    Returns the identity's roles after the change."""
    identity_hash_hex = identity_hex(identity_hash_hex)
    for role in roles:
        if role not in ROLES:
            raise ConfigError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
    path = Path(path)
    doc = tomlkit.parse(path.read_text())
    table = doc.setdefault("allow", tomlkit.table())
    current = list(table.get(identity_hash_hex, []))
    table[identity_hash_hex] = current + [r for r in roles if r not in current]
    write_toml(path, doc)
    return list(table[identity_hash_hex])


def revoke(path: str | os.PathLike[str], identity_hash_hex: str) -> bool:
    """Remove an identity from a tower's allow-list. Returns True if it was there."""
    return remove_entry(Path(path), "allow", identity_hex(identity_hash_hex))


class LiveAllowList:
    """A tower config's [allow] table, re-read when the file changes, so
    ``rngrid allow`` takes effect without restarting the tower. A config that
    stops parsing keeps the last good allow-list (and ``on_error`` hears why)."""

    def __init__(self, config: TowerConfig, on_error: Callable[[Exception], None] | None = None) -> None:
        self._allow = LiveToml(config.path, lambda path: load_tower(path).allow, initial=config.allow,
                               on_error=on_error)

    def roles_of(self, identity_hash: bytes) -> set[str]:
        roles = set(self._allow.value.get(identity_hash.hex(), ()))
        return (set(ROLES) - set(TOWER_ROLES)) | roles if "admin" in roles else roles

    def check_tower(self, key: bytes, role: str, name: str, what: str) -> None:
        """Raise WireError(not_allowed) unless the tower at destination ``key``
        (heard here) holds tower ``role`` on this list. ``name``: this tower's;
        ``what``: what the other would get, e.g. "to hold layers of its models"."""
        other = RNS.Identity.recall(key)
        if other is None or tower_destination_hash(other) != key or role not in self.roles_of(other.hash):
            who = other.hash.hex() if other is not None else "IDENTITY"
            raise WireError(Code.NOT_ALLOWED, f"tower {key.hex()} is not trusted by {name} {what}; its admin can "
                                              f"run: rngrid allow {who} --role {role}")
