"""Training job events over a Link's Channel.

``JobEvent`` 0x0301 ``[watch_id, event]``: ``event`` is a map with ``type``
"state", "started", "progress" (step, total_steps, loss, lr, tokens_per_s,
eta_s) or "end" (state, final_loss, duration_s, adapter_alias, adapter_blob,
peft_blob, error). A tower sends them to every Link watching the job.
"""

from dataclasses import dataclass, replace
from typing import Any, Self

from links.channel import ProtocolError, clip
from links.message import Message, checked_new, uint_field
from links.wire import json_safe


def _event(value: object) -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ProtocolError("a job event is a map with a type")
    # Made JSON-safe rather than refused: a refused message would stall the Channel.
    return json_safe(value)


@dataclass
class JobEvent(Message):
    MSGTYPE = 0x0301
    watch_id: int = uint_field("watch id")
    event: dict[str, Any] = checked_new(_event, dict)

    def fit(self, limit: int) -> Self:
        """The same event with its free text cut until it fits ``limit`` bytes."""
        event = dict(self.event)
        for field in ("error", "adapter_alias"):
            if isinstance(event.get(field), str):
                event[field] = clip(event[field], 64)
        if len(replace(self, event=event).pack()) > limit:
            event = {k: v for k, v in event.items() if k in ("type", "state", "step", "total_steps", "final_loss")}
        return replace(self, event=event)
