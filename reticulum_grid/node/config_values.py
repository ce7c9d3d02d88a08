"""Reading one value of a config table: the checks every config module
(config.py, voice_config.py) shares. Each raises ConfigError naming the key."""

from collections.abc import Mapping
from typing import Any

from announce.aliases import alias_problem


class ConfigError(ValueError):
    """A config that cannot be used; the message names the key and why."""


def typed(table: Mapping[str, Any], key: str, types: type | tuple[type, ...], default: Any) -> Any:
    """``table[key]`` (``default`` when absent), which must be of ``types`` (a
    bool is never an int here). Raises ConfigError."""
    value = table.get(key, default)
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ConfigError(f"{key} must be {types}, got bool")
    if not isinstance(value, types):
        raise ConfigError(f"{key} must be {getattr(types, '__name__', types)}, got {type(value).__name__}")
    return value


def seconds(table: Mapping[str, Any], key: str, default: float, lo: float) -> float:
    """``table[key]`` as a finite number of seconds >= ``lo``. Raises ConfigError."""
    value = float(typed(table, key, (int, float), default))
    if not lo <= value < float("inf"):
        raise ConfigError(f"{key} = {value} must be a number of seconds >= {lo}")
    return value


def bounded(table: Mapping[str, Any], key: str, default: int, lo: int, hi: int, where: str) -> int:
    """``table[key]``, an int in [``lo``, ``hi``]; ``where`` names the table in
    the error. Raises ConfigError."""
    value = typed(table, key, int, default)
    if not lo <= value <= hi:
        raise ConfigError(f"{where}.{key} = {value} is outside [{lo}, {hi}]")
    return value


def check_alias(alias: str, table: str) -> str:
    """``alias``, the key of a ``[table.ALIAS]`` table, when it is a usable
    alias (announce/aliases.py: the store and the caps take the same); else
    raises ConfigError naming the key."""
    problem = alias_problem(alias)
    if problem:
        raise ConfigError(f"[{table}.{alias}] in the config: {problem}")
    return alias
