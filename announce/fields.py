"""Field checks shared by the caps decoders (caps.py for announces, capsfull.py
for ``caps/full``): each returns the value when it is what the schema says
and raises CapsError naming the field otherwise. Nothing is coerced."""


class CapsError(ValueError):
    """A capability blob (or caps/full reply) that cannot be trusted; the message says why."""


def list_field(value: object, what: str, exact: int | None = None, most: int | None = None) -> list:
    """``value`` as a list (of ``exact`` items, or at most ``most``)."""
    if not isinstance(value, list):
        raise CapsError(f"{what} is {type(value).__name__}, not a list")
    if exact is not None and len(value) != exact:
        raise CapsError(f"{what} has {len(value)} items, expected {exact}")
    if most is not None and len(value) > most:
        raise CapsError(f"{what} has {len(value)} items, at most {most} allowed")
    return value


def map_field(value: object, what: str) -> dict:
    """``value`` as a map (its unknown keys are the caller's to ignore)."""
    if not isinstance(value, dict):
        raise CapsError(f"{what} is {type(value).__name__}, not a map")
    return value


def int_field(value: object, what: str, lo: int, hi: int) -> int:
    """``value`` as an integer in [lo, hi] (a bool is not an integer)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise CapsError(f"{what} is {type(value).__name__}, not an integer")
    if not lo <= value <= hi:
        raise CapsError(f"{what} {value} outside [{lo}, {hi}]")
    return value


def number_field(value: object, what: str, lo: float, hi: float) -> float:
    """``value`` (an int or a float, not NaN) in [lo, hi], as a float."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        raise CapsError(f"{what} is {type(value).__name__}, not a number")
    if not lo <= value <= hi:
        raise CapsError(f"{what} {value} outside [{lo}, {hi}]")
    return float(value)


def bool_field(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise CapsError(f"{what} is {type(value).__name__}, not a boolean")
    return value


def text_field(value: object, what: str, max_bytes: int, allow_empty: bool = True, controls: bool = False) -> str:
    """``value`` as a string of at most ``max_bytes`` UTF-8 bytes; control
    characters only with ``controls`` (free text such as an error message)."""
    if not isinstance(value, str):
        raise CapsError(f"{what} is {type(value).__name__}, not a string")
    if len(value.encode("utf-8", "surrogatepass")) > max_bytes:
        raise CapsError(f"{what} longer than {max_bytes} bytes")
    if not allow_empty and not value:
        raise CapsError(f"{what} is empty")
    if not controls and any(ord(c) < 32 for c in value):
        raise CapsError(f"{what} has control characters")
    return value
