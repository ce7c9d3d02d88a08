"""A worker tower lends its RPC server to one coordinator's plan at a time.

ggml-rpc serves one connection at a time, so two coordinators on one server
would queue behind each other with no word why. The lease says it instead:
``shard/tunnel`` from a second coordinator gets ``busy`` naming the holder,
while the holder's plan lives and moved bytes in the last ``idle_s`` seconds.
The holder's own new plan (the same tower identity: it planned again) ends its
old one first, and so does a plan that moved nothing for ``idle_s`` (a loaded
split model nobody uses). A holder whose Link closes ends its lease; one whose
tower died with its Link still up is found by the tunnel's keepalive
(split/tunnel.py) or TCP keepalive on the data plane (node/dataplane.py), and
its Link then closes.
"""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from links.wire import Code, WireError

log = logging.getLogger("rngrid.split.lease")

#: A held plan that moved no byte for this long gives way to another coordinator (seconds; ``[shard] yield_idle_s``).
IDLE_S = 300.0
#: What ``busy`` suggests waiting before asking again (seconds).
RETRY_AFTER_S = 10.0


@dataclass
class Holder:
    """One plan's hold: ``token`` tells plans apart (its Link session),
    ``who`` is the coordinator tower's identity hash (bytes), ``name`` how it
    is shown, ``end()`` closes its Link (and so its connections to the
    server), ``last_active()`` the time.monotonic() its connections last
    carried a byte (None: none yet)."""
    token: object
    who: bytes
    name: str
    end: Callable[[], None]
    last_active: Callable[[], float | None]
    taken_at: float = field(default_factory=time.monotonic)

    def idle_s(self) -> float:
        """Seconds since this plan last moved a byte (or took the server)."""
        return time.monotonic() - (self.last_active() or self.taken_at)


class RpcLease:
    """Which plan holds this worker's RPC server (``holder``, None when free)."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self.idle_s = idle_s
        self.holder: Holder | None = None
        self._lock = threading.Lock()

    def take(self, holder: Holder) -> bool:
        """Give the server to ``holder``. True when it is new (the server should
        be checked before use), False when the same plan (token) holds it
        already. Raises WireError(busy) while another coordinator's plan holds
        it and is in use."""
        with self._lock:
            current = self.holder
            if current is not None and current.token is holder.token:
                return False
            if current is not None and current.who != holder.who:
                idle = current.idle_s()
                if idle < self.idle_s:
                    raise WireError(Code.BUSY, f"this tower's RPC server serves a plan of {current.name} "
                                               f"(last used {idle:.0f} s ago); one plan at a time",
                                    retry_after=RETRY_AFTER_S)
            self.holder = holder
        if current is not None:
            log.info("the RPC server passes from a plan of %s to one of %s", current.name, holder.name)
            current.end()
        return True

    def release(self, token: object) -> None:
        """The plan ``token`` ended (its Link closed)."""
        with self._lock:
            if self.holder is not None and self.holder.token is token:
                self.holder = None
