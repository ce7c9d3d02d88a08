"""The responses a gateway keeps for ``previous_response_id``, ``GET`` and ``DELETE /v1/responses/{id}``.

OpenAI keeps every response made with ``store`` (true by default) for 30
days; a gateway keeps them in memory only, and only the last ones: at most
``max_items`` responses and ``max_chars`` characters of conversation (JSON),
the least recently used going first. A restart forgets them all. Each entry
holds its own turn (the input's chat messages, then the answer's) and the id
of the response before it, so a long conversation costs what it says once,
and asking for one touches the whole chain. Nothing here is sent anywhere.
"""

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from reticulum_grid.gateway.errors import ApiError, bad_request
from reticulum_grid.gateway.openai_api import ChatMessage

#: Responses kept, and characters of their conversations (about a byte each for English text).
MAX_ITEMS = 1000
MAX_CHARS = 64 << 20


@dataclass
class Stored:
    previous: str | None
    messages: list[ChatMessage]  # this turn's chat messages: its input, then the answer
    response: dict[str, Any]  # the Response object as it was answered
    chars: int


class ResponseStore:
    """Kept responses by id. Used from the event loop's thread only."""

    def __init__(self, max_items: int = MAX_ITEMS, max_chars: int = MAX_CHARS) -> None:
        self.max_items, self.max_chars = max_items, max_chars
        self._entries: OrderedDict[str, Stored] = OrderedDict()
        self._chars = 0

    def put(self, response: dict[str, Any], previous: str | None, messages: list[ChatMessage]) -> None:
        """Keep ``response`` (a Response object) with its turn's chat ``messages``,
        after response ``previous`` (None: the first turn)."""
        chars = len(json.dumps(messages)) + len(json.dumps(response))
        self._entries[response["id"]] = Stored(previous, messages, response, chars)
        self._chars += chars
        while self._entries and (len(self._entries) > self.max_items or self._chars > self.max_chars):
            _, gone = self._entries.popitem(last=False)
            self._chars -= gone.chars

    def get(self, response_id: str) -> dict[str, Any]:
        """The Response object kept as ``response_id``. Raises ApiError(404)."""
        return self._entry(response_id, 404).response

    def delete(self, response_id: str) -> None:
        """Forget ``response_id``; later turns that follow it can no longer be continued. Raises ApiError(404)."""
        self._entry(response_id, 404)
        self._chars -= self._entries.pop(response_id).chars

    def history(self, response_id: str) -> list[ChatMessage]:
        """The chat messages of the conversation up to and with ``response_id``,
        oldest first. Raises ApiError(400) naming ``previous_response_id``."""
        chain: list[tuple[str, Stored]] = []
        at: str | None = response_id
        while at is not None:
            entry = self._entry(at, 400)
            chain.append((at, entry))
            at = entry.previous
        for at, _ in reversed(chain):
            self._entries.move_to_end(at)
        return [m for _, entry in reversed(chain) for m in entry.messages]

    def _entry(self, response_id: str, status: int) -> Stored:
        entry = self._entries.get(response_id)
        if entry is not None:
            return entry
        message = (f"Response with id {response_id!r} not found: this gateway keeps the last {self.max_items} "
                   "responses made with store true, in memory, until it restarts")
        if status == 400:
            raise bad_request(message, "previous_response_id")
        raise ApiError(404, message, code="not_found", param="response_id")
