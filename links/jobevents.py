"""Training job events over a Link's Channel.

``JobEvent`` 0x0301 ``[watch_id, event]``: ``event`` is a map with ``type``
"state", "started", "progress" (step, total_steps, loss, lr, tokens_per_s,
eta_s) or "end" (state, final_loss, duration_s, adapter_alias, adapter_blob,
peft_blob, error). A tower sends them to every Link watching the job.
"""

from typing import Any

import msgpack
import RNS

from links.channel import ProtocolError, clip, uint, unpack_array
from links.wire import json_safe


class JobEvent(RNS.MessageBase):
    MSGTYPE = 0x0301

    def __init__(self, watch_id: int = 0, event: dict[str, Any] | None = None) -> None:
        self.watch_id, self.event = watch_id, event or {}

    def pack(self) -> bytes:
        return msgpack.packb([self.watch_id, self.event], use_bin_type=True)

    def fit(self, limit: int) -> "JobEvent":
        """The same event with its free text cut until it fits ``limit`` bytes."""
        event = dict(self.event)
        for field in ("error", "adapter_alias"):
            if isinstance(event.get(field), str):
                event[field] = clip(event[field], 64)
        if len(JobEvent(self.watch_id, event).pack()) > limit:
            event = {k: v for k, v in event.items() if k in ("type", "state", "step", "total_steps", "final_loss")}
        return JobEvent(self.watch_id, event)

    def unpack(self, raw: bytes) -> None:
        watch_id, event = unpack_array(raw, 2)
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise ProtocolError("a job event is a map with a type")
        # Made JSON-safe rather than refused: a refused message would stall the Channel.
        self.watch_id, self.event = uint(watch_id, "watch id"), json_safe(event)
