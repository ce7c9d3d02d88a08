"""One ``ai/inference`` request on the grid, with failover.

The request goes to the best ranked tower (router.py). A tower that refuses
or fails before the first token (busy, gone, no memory, ...) is skipped and
the next one tried, without the caller seeing an error. A tower that dies
mid-stream is replaced: another tower holding the same model blob continues
from the prompt plus the tokens already generated (the stream carries their
ids), so at temperature 0 the joined text equals an uninterrupted run. When
that is impossible (no other tower has the model, or the request uses stop
strings, whose held-back text makes the token boundary uncertain) the error
says how far it got.
"""

import secrets
import time
from dataclasses import dataclass

from links.stream import MAX_STREAM_ID, TextDecoder
from links.wire import Code, WireError

#: Errors after which, before any output, the next tower is tried.
RETRY_BEFORE_OUTPUT = {Code.BUSY, Code.UNREACHABLE, Code.TIMEOUT, Code.NOT_ALLOWED, Code.UNKNOWN_MODEL,
                       Code.UNKNOWN_ADAPTER, Code.INSUFFICIENT_MEMORY, Code.INTERNAL}
#: Errors that mean the tower (or the way to it) went away.
LINK_LOST = {Code.UNREACHABLE, Code.TIMEOUT}
#: Towers tried for one request at most.
MAX_TOWERS = 4
#: A stream silent this long (no token, no heartbeat) lost its tower (seconds;
#: at least 3 heartbeats, more on a slow link: 10 RTTs).
STREAM_SILENCE_S = 3.5
#: A tower answers ai/inference at once; no reply in this long (or 10 RTTs) means it is gone.
REPLY_TIMEOUT_S = 5.0


@dataclass
class Usage:
    """Ends an inference stream. Tokens are counts; times in seconds; rate in tokens/s.

    ``ttft_s`` is measured by the client, from execute() to the first text;
    ``tower_ttft_s`` is the (last) tower's prompt processing time to the first token;
    ``failovers`` counts towers that failed mid-stream and were replaced."""
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    tokens_per_s: float
    tower: str
    finish_reason: str
    tower_ttft_s: float = 0.0
    queued_s: float = 0.0
    failovers: int = 0


class InferenceStream:
    """Iterator of text pieces (str) followed by one Usage.

    Leaving the iteration early (break, exception, Ctrl-C) cancels the stream
    on the tower. ``text`` holds what arrived; ``usage`` is set at the end."""

    def __init__(self, grid, payload, choices, progress=None, started=None):
        self.grid = grid
        self.payload = payload
        self.choices = list(choices)[:MAX_TOWERS]
        self.progress = progress
        self.started = started or time.perf_counter()
        self.text = ""
        self.usage = None
        self.ids = []
        self._current = None  # (connection, stream id) while a tower streams to us
        self._first_at = None
        self._failovers = 0
        self._busy = []

    def __iter__(self):
        decoder = TextDecoder()
        model_blob = None
        errors = []
        try:
            for choice in self.choices:
                entry = choice.entry
                if model_blob is not None and not self._can_continue(entry, model_blob):
                    continue
                try:
                    receiver, entry = self._start(entry)
                except WireError as e:
                    self._note_refusal(entry, e, errors)
                    continue
                model_blob = model_blob or entry.caps.model(self.payload["model"]).short_id
                ids_before = len(self.ids)
                try:
                    silence = max(STREAM_SILENCE_S, 10 * self.grid.health.get(entry.destination_hash).rtt_s)
                    for event in receiver.events(silence, self._current[0].router):
                        if event[0] == "data":
                            self.ids += event[2]
                            text = decoder.feed(event[1])
                            if text:
                                yield self._emit(text)
                        else:
                            tail = decoder.finish()
                            if tail:
                                yield self._emit(tail)
                            self._release()
                            self.grid.health.succeeded(entry.destination_hash)
                            self.usage = self._usage(entry, event[1], event[2], ids_before)
                            yield self.usage
                            return
                except WireError as e:
                    self._release()
                    if e.code not in LINK_LOST and not (e.code in RETRY_BEFORE_OUTPUT and not self.ids):
                        raise
                    self.grid.health.failed(entry.destination_hash)
                    errors.append(f"{entry.name}: {e.message}")
                    if self.ids:
                        self._check_continuable(entry, e)
                        self._failovers += 1
            raise self._exhausted(errors)
        finally:
            if self._current is not None:
                self.cancel()

    def _emit(self, text):
        if self._first_at is None:
            self._first_at = time.perf_counter()
        self.text += text
        return text

    def _start(self, entry):
        """Sync what the tower lacks, send the request; (receiver, entry). Raises WireError."""
        model, adapter = self.payload["model"], self.payload.get("adapter")
        if entry.caps.model(model) is None:
            entry = self.grid.sync_to(entry, model, "model", self.progress)
        if isinstance(adapter, str) and entry.caps.adapter(adapter) is None:
            entry = self.grid.sync_to(entry, adapter, "adapter", self.progress)
        payload = dict(self.payload)
        if self.ids:
            payload["continue_tokens"] = list(self.ids)
            payload["max_tokens"] = payload.get("max_tokens", 256) - len(self.ids)
        conn = self.grid.connection(entry)
        stream_id = secrets.randbelow(MAX_STREAM_ID)
        receiver = conn.open_stream(stream_id)
        try:
            rtt = self.grid.health.get(entry.destination_hash).rtt_s
            conn.request("ai/inference", {**payload, "stream_id": stream_id}, max(REPLY_TIMEOUT_S, 10 * rtt))
        except BaseException:
            conn.close_stream(stream_id)
            raise
        self._current = (conn, stream_id)
        self.grid.health.started(entry.destination_hash)
        return receiver, entry

    def _note_refusal(self, entry, error, errors):
        if error.code not in RETRY_BEFORE_OUTPUT:
            raise error
        if error.code == Code.BUSY:
            self._busy.append(error.retry_after or 0.0)
        else:
            self.grid.health.failed(entry.destination_hash)
        errors.append(f"{entry.name}: {error.code}: {error.message}")

    def _can_continue(self, entry, model_blob):
        cap = entry.caps.model(self.payload["model"])
        return cap is not None and cap.short_id == model_blob

    def _check_continuable(self, entry, error):
        if self.payload.get("stop"):
            raise WireError(error.code, f"tower {entry.name} went away after {len(self.ids)} tokens "
                                        f"({len(self.text)} characters); a request with stop strings "
                                        "cannot be continued elsewhere") from None

    def _exhausted(self, errors):
        model = self.payload["model"]
        if self.ids:
            return WireError(Code.UNREACHABLE, f"the stream stopped after {len(self.ids)} tokens "
                                               f"({len(self.text)} characters) and no other tower with {model!r} "
                                               f"could continue it: {'; '.join(errors)}")
        if self._busy and len(self._busy) == len(errors):
            return WireError(Code.BUSY, f"all {len(errors)} towers with {model!r} are busy",
                             retry_after=min(self._busy))
        return WireError(Code.NO_TOWER, f"no tower could run {model!r}: {'; '.join(errors) or 'none heard'}")

    @property
    def tower(self):
        """Name of the tower streaming now (None when none is)."""
        return self._current[0].name if self._current else None

    def _release(self):
        if self._current is not None:
            conn, stream_id = self._current
            self._current = None
            conn.close_stream(stream_id)

    def cancel(self):
        """Stop generation on the tower (idempotent)."""
        if self._current is not None:
            conn, stream_id = self._current
            self._current = None
            conn.cancel(stream_id)

    def _usage(self, entry, finish_reason, usage, ids_before):
        def num(key, kind=float):
            value = usage.get(key, 0)
            return kind(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else kind(0)
        return Usage(prompt_tokens=num("prompt_tokens", int) - ids_before,
                     completion_tokens=num("completion_tokens", int) + ids_before,
                     ttft_s=(self._first_at or time.perf_counter()) - self.started, tokens_per_s=num("tokens_per_s"),
                     tower=entry.name, finish_reason=finish_reason, tower_ttft_s=num("ttft_s"),
                     queued_s=num("queued_s"), failovers=self._failovers)
