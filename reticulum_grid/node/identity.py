"""Persistent RNS identities: created once, never silently replaced.

An identity file holds the 64-byte private key (RNS.Identity.to_file format).
A tower's destination hash derives from it, so a tower keeps its address and
its place in everyone's allow-lists across restarts.
"""

import os
from pathlib import Path

import RNS


class IdentityError(RuntimeError):
    pass


def load_or_create(path: str | os.PathLike[str]) -> RNS.Identity:
    """Load the identity at ``path``, or create it (mode 0600) when absent.

    Raises IdentityError when the file exists but cannot be read as an
    identity; it is left untouched so no allow-list entry is lost by accident."""
    path = Path(path)
    if path.exists():
        identity = None
        try:
            if path.stat().st_size == RNS.Identity.KEYSIZE // 8:
                identity = RNS.Identity.from_file(str(path))
        except OSError as e:
            raise IdentityError(f"cannot read identity file {path}: {e}") from None
        if identity is None:
            raise IdentityError(
                f"identity file {path} is not a valid RNS identity ({path.stat().st_size} bytes, "
                f"expected {RNS.Identity.KEYSIZE // 8}); refusing to start with a new identity. "
                "Restore the file, or move it away to create a new identity.")
        return identity
    path.parent.mkdir(parents=True, exist_ok=True)
    identity = RNS.Identity()
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(identity.get_private_key())
    os.replace(tmp, path)
    return identity
