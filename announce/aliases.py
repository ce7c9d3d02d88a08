"""The one rule for aliases: the human names of blobs, models, adapters and
voice engines, used alike by a tower's config (node/config.py), its blob
store (store/names.py) and the caps decoder (caps.py).

An alias travels in caps (at most ALIAS_MAX_BYTES), names a file's entry in a
store and is typed on command lines, so it is plain: no path parts, nothing
that reads as a blob id (8+ hex digits), which a name lookup tries as well.
"""

import re

ALIAS_MAX_BYTES = 32
ALIAS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,%d}" % (ALIAS_MAX_BYTES - 1))
BLOB_ID_PREFIX_RE = re.compile(r"[0-9a-fA-F]{8,64}")


def is_blob_id_prefix(name: object) -> bool:
    """True when ``name`` reads as a blob id or a prefix of one (8-64 hex digits)."""
    return isinstance(name, str) and BLOB_ID_PREFIX_RE.fullmatch(name) is not None


def alias_problem(alias: object) -> str | None:
    """Why ``alias`` is not a usable alias (a sentence naming it), or None when it is."""
    if (not isinstance(alias, str) or not ALIAS_RE.fullmatch(alias) or ".." in alias
            or is_blob_id_prefix(alias)):
        return (f"alias {alias!r} must be 1-{ALIAS_MAX_BYTES} of A-Z a-z 0-9 . _ : + - starting with a letter or "
                "digit (no spaces, no path separators, no '..', not only hex digits)")
    return None
