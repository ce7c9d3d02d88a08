"""Authorisation checks on a Link: default deny, explicit refusals.

RNS's own ALLOW_LIST answers a refused request with silence (the client times
out), so towers register handlers open to all and check here, answering a
``not_allowed`` error that says what to do.
"""

from collections.abc import Callable

import RNS

from links.wire import Code, WireError


def require(remote_identity: RNS.Identity | None, role: str | tuple[str, ...], roles_of: Callable[[bytes], set[str]],
            tower_role: bool = False) -> None:
    """Raise WireError(not_allowed) unless the Link's identity holds ``role``
    (a role name, or a tuple of names any of which will do). The message says
    which case it is: "not identified", "not on this tower's allow-list" (a
    stranger) or "not allowed to ROLE" (known, but lacking that role).
    ``tower_role``: the role is one towers grant each other (shard,
    train-peer): the advice says to grant it to the other tower's identity.

    ``roles_of(identity_hash: bytes) -> set of role names``."""
    wanted = role if isinstance(role, tuple) else (role,)
    named = " or ".join(wanted)
    if remote_identity is None:
        raise WireError(Code.NOT_ALLOWED,
                        f"this link is not identified; '{named}' needs an identity on the tower's allow-list")
    held = roles_of(remote_identity.hash)
    if not set(wanted) & held:
        who = remote_identity.hash.hex()
        # Two cases a user fixes differently: a stranger (not on the list at
        # all) and a known identity that lacks this one role.
        why = (f"identity {who} is not on this tower's allow-list" if not held else
               f"identity {who} is not allowed to {named} on this tower (it may: {', '.join(sorted(held))})")
        if tower_role:
            raise WireError(Code.NOT_ALLOWED, f"{why}; {named} is granted to another tower's identity only (never a "
                                              f"user's), by this tower's admin: rngrid allow TOWER-IDENTITY --role "
                                              f"{wanted[0]}")
        raise WireError(Code.NOT_ALLOWED, f"{why}; its admin can run: rngrid allow {who} --role {wanted[0]}")
