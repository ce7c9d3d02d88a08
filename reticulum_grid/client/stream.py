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

When every tower answered busy (before any output) and the request has a
busy-wait, it waits for room (a free slot or queue place) and asks again
(client/busy.py); the caller sees busy only once that wait's deadline passed
and a last ask was busy too, with that last answer's retry hint.

Each attempt to reach a tower is bounded by what its link has shown
(connection.attempt_timeout), so a frozen or dead tower costs seconds, not a
fixed 15 s. When every ranked tower failed because it was gone (or the stream
lost its tower), the stream looks again once (Liveness.look_again: a discovery
ping, path requests to remembered towers) before giving up. The final error
carries the most specific reason a tower gave (not_allowed, busy, ...) and
names every tower tried; no_tower means no tower was there.
"""

import secrets
import time
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from announce.caps import ModelCap
from announce.table import TowerEntry
from links.stream import MAX_STREAM_ID, EndEvent, StreamReceiver, TextDecoder, TokenEvent, decoded
from links.usage import StreamUsage, decode_usage
from links.wire import LINK_LOST, Code, WireError
from reticulum_grid.client.busy import BusyWait
from reticulum_grid.client.parts import GridParts
from reticulum_grid.client.pieces import Text, ToolCallDelta, Usage, logprobs, tool_call
from reticulum_grid.client.router import Choice
from reticulum_grid.node.connection import TowerConnection
from reticulum_grid.store.sync import Progress


#: Errors after which, before any output, the next tower is tried.
RETRY_BEFORE_OUTPUT = {Code.BUSY, *LINK_LOST, Code.NOT_ALLOWED, Code.UNKNOWN_MODEL, Code.UNKNOWN_ADAPTER,
                       Code.INSUFFICIENT_MEMORY, Code.INTERNAL, Code.RUNNER_LOST, Code.PROTOCOL_MISMATCH}
#: Errors after which a stream that already gave text continues on another tower.
CONTINUE_AFTER = LINK_LOST | {Code.RUNNER_LOST}
#: Towers tried for one request at most.
MAX_TOWERS = 4
#: Tokens a stream must bring to measure its rate (router.HealthBook.measured).
MEASURE_MIN_TOKENS = 4
#: A stream silent this long (no token, no heartbeat) lost its tower (seconds;
#: at least 3 heartbeats, more on a slow link: 10 RTTs).
STREAM_SILENCE_S = 3.5
#: The final error's code when towers refused for different reasons: the first
#: of these any tower gave (busy can pass; the others say what to fix).
SPECIFIC_FIRST = (Code.BUSY, Code.NOT_ALLOWED, Code.PROTOCOL_MISMATCH, Code.UNKNOWN_ADAPTER, Code.UNKNOWN_MODEL,
                  Code.INSUFFICIENT_MEMORY, Code.INTERNAL, Code.TIMEOUT, Code.UNREACHABLE)


#: Keys of an ai/inference payload for this client only (how to route it), never sent to a tower.
CLIENT_KEYS = ("placement", "split_policy")


def continued(payload: dict[str, Any], ids: Sequence[int], generated: int | None = None) -> dict[str, Any]:
    """``payload`` (an ai/inference request map) made to continue after the
    generated token ``ids`` (a copy without CLIENT_KEYS; the same when there
    are none); ``generated``: how many tokens those were generated as
    (default len(ids))."""
    payload = {k: v for k, v in payload.items() if k not in CLIENT_KEYS}
    if ids:
        payload["continue_tokens"] = list(payload.get("continue_tokens") or ()) + list(ids)
        # 0 when the tower died after the last token: the next one only ends the
        # stream and counts the prompt.
        asked = payload.get("max_tokens")
        payload["max_tokens"] = max(0, (256 if asked is None else asked) - (len(ids) if generated is None else
                                                                           generated))
    return payload


@dataclass(frozen=True)
class Ask:
    """An ai/inference payload as this client reads it, in one place:
    ``model`` (an alias or a blob id prefix) and ``adapter`` (None when the
    payload names none)."""
    model: str
    adapter: str | None

    @classmethod
    def of(cls, payload: object) -> "Ask":
        """Raises WireError(bad_request) for a payload that is no map or has no 'model' string."""
        if not isinstance(payload, dict) or not isinstance(payload.get("model"), str):
            raise WireError(Code.BAD_REQUEST, "ai/inference needs a payload map with a 'model' string")
        adapter = payload.get("adapter")
        return cls(payload["model"], adapter if isinstance(adapter, str) else None)


class _Meter:
    """A stream's rate on this client's clock: the tokens it counted itself
    (TokenEvent.counted, never the tower's own count) over the time from
    sending the request (``sent_at``, perf_counter seconds) to the last of
    them. From the send, not from the first token: a tower that held its
    tokens back to send them in one burst would look fast otherwise, and
    reading the prompt is part of what a request waits for."""

    def __init__(self, sent_at: float) -> None:
        self.sent_at = sent_at
        self.last_at: float | None = None
        self.count = 0
        self.first: tuple[float, int] | None = None  # (perf_counter, tokens) of the first arrival

    def tokens(self, count: int) -> None:
        self.count += count
        self.last_at = time.perf_counter()
        if self.first is None:
            self.first = (self.last_at, self.count)

    def decode_rate(self) -> float | None:
        """Tokens/s from the first arrival to the last (the prompt's time left
        out), or None when too few tokens came after it to tell."""
        if self.first is None or self.last_at is None or self.count - self.first[1] < MEASURE_MIN_TOKENS \
                or self.last_at <= self.first[0]:
            return None
        return (self.count - self.first[1]) / (self.last_at - self.first[0])

    def rate(self) -> float | None:
        """Tokens/s, or None when too few tokens came to tell."""
        if self.count < MEASURE_MIN_TOKENS or self.last_at is None or self.last_at <= self.sent_at:
            return None
        return self.count / (self.last_at - self.sent_at)


class InferenceStream:
    """Iterator of text pieces (Text; ToolCallDelta when the model calls a
    tool) followed by one Usage.

    Leaving the iteration early (break, exception, Ctrl-C) cancels the stream
    on the tower. ``text`` holds what arrived; ``usage`` is set at the end.
    ``busy_wait``: a BusyWait (client/busy.py) for when every tower is busy;
    ``tower``: the tower asked for (re-ranking after a busy wait keeps to it)."""

    def __init__(self, grid: GridParts, payload: dict[str, Any], choices: Iterable[Choice],
                 progress: Progress | None = None, started: float | None = None, busy_wait: BusyWait | None = None,
                 tower: str | None = None) -> None:
        self.grid = grid
        self.payload = payload
        self.ask = Ask.of(payload)
        self.choices = list(choices)[:MAX_TOWERS]
        self.progress = progress
        self.started = started or time.perf_counter()
        self.busy_wait = busy_wait or BusyWait(grid, 0.0)
        self._tower = tower
        self.text = ""
        self.usage: Usage | None = None
        self.ids: list[int] = []
        self.generated = 0  # tokens generated so far (may differ from len(ids), see inference/generation.py)
        self._exact = True  # every piece came with ids another tower can continue from
        self._current: tuple[TowerConnection, int] | None = None  # (connection, stream id) while a tower streams
        self._first_at: float | None = None
        self._failovers = 0
        self._errors: list[tuple[str, WireError]] = []  # (tower name, WireError) per failed attempt
        self._tried: dict[bytes, float] = {}  # destination hash -> wall-clock time it failed
        self._model_blob: bytes | None = None

    def __iter__(self) -> Generator["Text | ToolCallDelta | Usage", None, None]:
        decoder = TextDecoder()
        try:
            choices, looked_again = self.choices, False
            while True:
                for choice in choices:
                    if len(self._errors) >= 2 * MAX_TOWERS:
                        break
                    if (yield from self._attempt(choice.entry, decoder)):
                        return
                if self._waited_for_slot():
                    choices = self.grid.rank(self.ask.model, adapter=self.ask.adapter, tower=self._tower)
                    continue
                if looked_again or not self._worth_looking_again():
                    break
                looked_again = True
                choices = self.grid.liveness.look_again(self.ask.model, self._tried, adapter=self.ask.adapter)
            raise self._exhausted()
        finally:
            if self._current is not None:
                self.cancel()

    def _attempt(self, entry: TowerEntry,
                 decoder: TextDecoder) -> Generator["Text | ToolCallDelta | Usage", None, bool]:
        """Run (or continue) the stream on ``entry``, yielding its text; True once
        it ended with a Usage, False when the next tower should be tried."""
        if self._model_blob is not None and not self._can_continue(entry, self._model_blob):
            return False
        try:
            receiver, entry, sent_at = self._start(entry)
        except WireError as e:
            self._note_refusal(entry, e)
            return False
        self._model_blob = self._model_blob or cast(ModelCap, entry.caps.model(self.ask.model)).short_id  # synced
        before = (len(self.ids), self.generated)
        meter = _Meter(sent_at)
        try:
            # _start set _current and its connection's Link (cancel() may clear _current from another thread).
            rtt = max(self.grid.health.get(entry.destination_hash).rtt_s,
                      self._current[0].link.rtt or 0.0)  # type: ignore[index, union-attr]
            silence = max(STREAM_SILENCE_S, 10 * rtt)
            for event in decoded(receiver.events(silence, self._current[0].router), decoder):  # type: ignore[index]
                if isinstance(event, TokenEvent):
                    yield from self._token(event, meter)
                    continue
                self._release()
                self.grid.health.ended(entry.destination_hash)
                self.grid.health.succeeded(entry.destination_hash)
                rate = meter.rate()
                if rate is not None:
                    self.grid.health.measured(entry.destination_hash, rate, entry.caps.hardware, meter.decode_rate())
                self.usage = self._usage(entry, event, before)
                yield self.usage
                return True
        except WireError as e:
            self._release()
            self.grid.health.ended(entry.destination_hash)
            if e.code not in CONTINUE_AFTER and not (e.code in RETRY_BEFORE_OUTPUT and not self.generated):
                raise
            self._failed(entry, e)
            if self.generated:
                self._check_continuable(entry, e)
                self._failovers += 1
        return False

    def _token(self, event: TokenEvent, meter: _Meter) -> Iterator["Text | ToolCallDelta"]:
        """Count one token chunk and yield its pieces: Text, then any ToolCallDelta."""
        if event.data or event.ids or event.extra:  # not decoded()'s tail
            meter.tokens(event.counted)
            self.ids += event.ids
            self.generated += event.generated
            self._exact = self._exact and not event.extra.get("x")
        if event.text or event.extra.get("lp"):
            yield self._emit(event.text, event.extra.get("lp", ()))
        for call in event.extra.get("tc", ()):
            yield tool_call(call)

    def _waited_for_slot(self) -> bool:
        """When nothing came yet and the towers said busy: wait (client/busy.py);
        True to ask again (the busy answers are forgotten, so a refusal carries
        the latest hint), False to give up.
        Raises WireError(cancelled) when cancel() stopped the wait."""
        if self.generated or not self._errors:
            return False
        error = self._exhausted()
        if error.code != Code.BUSY:
            return False
        # Towers that failed otherwise (gone, not allowed, ...) do not count when they announce a free slot.
        if not self.busy_wait.wait(self.ask.model, error, exclude=set(self._tried)):
            if self.busy_wait.stopped.is_set():
                raise WireError(Code.CANCELLED, "cancelled while waiting for a free slot")
            return False
        self._errors = [(name, e) for name, e in self._errors if e.code != Code.BUSY]
        return True

    def _failed(self, entry: TowerEntry, error: WireError) -> None:
        self._errors.append((entry.name, error))
        self._tried[entry.destination_hash] = time.time()
        self.grid.liveness.failed(entry, error)

    def _worth_looking_again(self) -> bool:
        """Look again when the stream lost its tower, or a tower was gone (not when
        every tower refused: asking again would get the same answers)."""
        return bool(self.generated) or any(e.code in LINK_LOST for _, e in self._errors)

    def _emit(self, text: str, probabilities: object = ()) -> Text:
        if self._first_at is None:
            self._first_at = time.perf_counter()
        self.text += text
        piece = Text(text)
        piece.logprobs = logprobs(probabilities)
        return piece

    def _start(self, entry: TowerEntry) -> tuple[StreamReceiver, TowerEntry, float]:
        """Sync what the tower lacks, send the request; (receiver, entry, the
        perf_counter time the request went). Raises WireError."""
        model, adapter = self.ask.model, self.ask.adapter
        if entry.caps.model(model) is None:
            entry = self.grid.sync_to(entry, model, "model", self.progress)
        if adapter is not None and entry.caps.adapter(adapter) is None:
            entry = self.grid.sync_to(entry, adapter, "adapter", self.progress)
        payload = continued(self.payload, self.ids, self.generated)
        conn = self.grid.connection(entry)
        stream_id = secrets.randbelow(MAX_STREAM_ID)
        # The tower answers ai/inference at once (generation runs on its own thread).
        bound = self.grid.liveness.attempt_timeout(entry)
        receiver = conn.open_stream(stream_id, link_timeout=bound)
        sent_at = time.perf_counter()
        try:
            conn.request("ai/inference", {**payload, "stream_id": stream_id}, bound, link_timeout=bound)
        except BaseException:
            conn.close_stream(stream_id)
            raise
        self._current = (conn, stream_id)
        self.grid.health.started(entry.destination_hash)
        return receiver, entry, sent_at

    def _note_refusal(self, entry: TowerEntry, error: WireError) -> None:
        if error.code not in RETRY_BEFORE_OUTPUT:
            raise error
        if error.code == Code.BUSY:
            self._errors.append((entry.name, error))
        else:
            self._failed(entry, error)

    def _can_continue(self, entry: TowerEntry, model_blob: bytes) -> bool:
        cap = entry.caps.model(self.ask.model)
        return cap is not None and cap.short_id == model_blob

    def _check_continuable(self, entry: TowerEntry, error: WireError) -> None:
        why = ("stop strings" if self.payload.get("stop") else "tools" if _uses_tools(self.payload) else
               "text whose tokens the tower could not tell" if not self._exact else None)
        if why:
            raise WireError(error.code, f"tower {entry.name} went away after {self.generated} tokens "
                                        f"({len(self.text)} characters); a request with {why} "
                                        "cannot be continued elsewhere") from None

    def _exhausted(self) -> WireError:
        """The error once no tower is left: the most telling code a tower gave
        (busy with the shortest retry hint, not_allowed, ...), naming every try."""
        model = self.ask.model
        tried = "; ".join(f"{name}: {e.code}: {e.message}" for name, e in self._errors) or "none"
        if self.generated:
            return WireError(Code.UNREACHABLE, f"the stream stopped after {self.generated} tokens "
                                               f"({len(self.text)} characters) and no other tower with {model!r} "
                                               f"could continue it (looked again for towers); tried {tried}")
        if not self._errors:
            return WireError(Code.NO_TOWER, f"no tower could run {model!r}: none heard")
        codes = {e.code for _, e in self._errors}
        code = next((c for c in SPECIFIC_FIRST if c in codes), Code.UNREACHABLE)
        busy = [e.retry_after or 0.0 for _, e in self._errors if e.code == Code.BUSY]
        if code == Code.BUSY and len(busy) == len(self._errors):
            return WireError(Code.BUSY, f"all {len(busy)} towers with {model!r} are busy", retry_after=min(busy))
        if code == Code.NOT_ALLOWED and codes == {Code.NOT_ALLOWED}:
            return WireError(code, f"no tower with {model!r} lets this identity run it; tried {tried}")
        return WireError(code, f"no tower could run {model!r}; tried {tried}",
                         retry_after=min(busy) if code == Code.BUSY else None)

    @property
    def tower(self) -> str | None:
        """Name of the tower streaming now (None when none is)."""
        return self._current[0].name if self._current else None

    def _release(self) -> None:
        if self._current is not None:
            conn, stream_id = self._current
            self._current = None
            conn.close_stream(stream_id)

    def cancel(self) -> None:
        """Stop generation on the tower (idempotent; may be called from another
        thread than the one iterating, which then gets WireError(cancelled))."""
        self.busy_wait.stop()  # a wait for a free slot ends at once
        current, self._current = self._current, None  # one read: the iterating thread may clear it meanwhile
        if current is not None:
            conn, stream_id = current
            conn.cancel(stream_id)

    def _usage(self, entry: TowerEntry, end: EndEvent, before: tuple[int, int]) -> Usage:
        """The stream's Usage from its EndEvent, counting the tokens of the
        towers ``before`` this one ((ids, generated) so far)."""
        reported, (ids_before, generated_before) = decode_usage(end.usage, StreamUsage), before
        return Usage.of(reported, prompt_tokens=reported.prompt_tokens - ids_before,
                        completion_tokens=reported.completion_tokens + generated_before,
                        ttft_s=(self._first_at or time.perf_counter()) - self.started, tower=entry.name,
                        finish_reason=end.finish_reason, failovers=self._failovers)


def _uses_tools(payload: dict[str, Any]) -> bool:
    return bool(payload.get("tools")) and payload.get("tool_choice") != "none"
