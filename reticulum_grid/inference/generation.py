"""One generation on a runner: prompt tokens in, text pieces with their token ids out.

A request's prompt becomes tokens the way llama-server itself makes them (a
chat through the model's own template, ``/apply-template``, then
``/tokenize`` with special tokens; a plain prompt tokenized the same way),
followed by ``continue_tokens`` (tokens another tower already generated), and
goes to ``/completion`` as token ids, streamed with ``return_tokens``. So a
tower that continues another's stream starts from exactly the tokens the
first one had.

The runner sends a text piece only once it holds whole UTF-8 characters, and
its pieces carry the id of their last token only: when a character took
several tokens, the ids of the earlier ones are not in its stream. Those
pieces get ids from ``/tokenize`` of their own text instead (byte-for-byte
the same text; checked with ``/detokenize``), so the stream never loses or
repeats text when another tower continues it; ``n`` says how many tokens the
piece really took, for the usage.

Requests with ``tools`` go to the runner's ``/v1/chat/completions`` (its
tool-call parser for the model's template) and stream text and tool-call
deltas, or, for a template without tools, ask for one JSON answer whose text
and call stream as it grows (tools.py); they are not continued elsewhere once
text arrived.
"""

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from links.usage import StreamUsage
from reticulum_grid.inference import tools
from reticulum_grid.inference.runner import Runner, RunnerError, RunnerStream

if TYPE_CHECKING:  # request.py imports this module
    from reticulum_grid.inference.request import InferenceRequest

#: llama-server's per-request LoRA list: [{"id": adapter index, "scale": float}].
Lora = Sequence[dict[str, Any]]


@dataclass
class Generation:
    """What one generation produced. Times in seconds, rates in tokens/s.

    ``ttft_s``: from the start to the first text out; ``prompt_s`` and
    ``decode_s``: llama.cpp's own times reading the prompt and generating after
    it (its ``prompt_ms`` and ``predicted_ms``); ``tokens_per_s`` is its eval
    rate (the tokens after the first over ``decode_s``); ``cached_tokens``: prompt
    tokens the runner reused from its cache; ``draft_tokens`` /
    ``draft_accepted``: speculative decoding's proposals and how many held."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "length"
    ttft_s: float = 0.0
    prompt_s: float = 0.0
    decode_s: float = 0.0
    tokens_per_s: float = 0.0
    cached_tokens: int = 0
    draft_tokens: int = 0
    draft_accepted: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # a stream's own end figures (embeddings, voice)

    def usage(self, queued_s: float, tower: str) -> StreamUsage:
        """The stream's usage as the end message carries it (links/usage.py);
        ``queued_s``: seconds the request waited for its turn; ``tower``: this tower's name."""
        return StreamUsage(self.prompt_tokens, self.completion_tokens, round(self.ttft_s, 4),
                           round(self.tokens_per_s, 2), round(queued_s, 4), tower, self.cached_tokens,
                           self.draft_tokens, self.draft_accepted if self.draft_tokens else 0,
                           prompt_s=round(self.prompt_s, 4), decode_s=round(self.decode_s, 4))


@dataclass
class Piece:
    """One streamed piece: UTF-8 ``data`` (whole characters), the token ``ids``
    it came from, ``n`` tokens generated for it (may exceed len(ids), see the
    module doc), and per-token ``logprobs`` or ``tool_calls`` deltas."""
    data: bytes
    ids: list[int]
    n: int
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    exact: bool = True  # ids give exactly these bytes: another tower may continue from them


class ContextLengthExceeded(ValueError):
    pass


class AdapterError(ValueError):
    pass


#: Seconds of prompt processing allowed per prompt token before the first token (on top of the
#: runner's stream timeout): a CPU reads a few hundred tokens a second, a split model fewer.
PROMPT_TOKEN_S = 0.05

#: The runner's stop types -> OpenAI finish reasons.
FINISH = {"eos": "stop", "word": "stop", "limit": "length", "none": "stop"}


def prompt_tokens(runner: Runner, prompt: str | None = None, messages: list[dict[str, Any]] | None = None,
                  continued: Sequence[int] = ()) -> list[int]:
    """Prompt tokens as llama-server makes them, then ``continued``. Raises
    ValueError (an empty prompt, ids outside the vocabulary, a template that
    refuses the messages) and ContextLengthExceeded when no room is left (a
    continuation may fill the window exactly: its first tower stopped there)."""
    if messages is not None:
        try:
            prompt = runner.call("POST", "/apply-template", {"messages": messages})["prompt"]
        except RunnerError as e:
            if e.status >= 500 or e.status == 0:
                raise
            raise ValueError(f"the model's chat template refused these messages: {e.message}") from None
    tokens = runner.call("POST", "/tokenize", {"content": prompt, "add_special": True, "parse_special": True})["tokens"]
    if not tokens:
        raise ValueError("the prompt is empty: it must give at least one token")
    n_vocab = runner.n_vocab
    if any(t >= n_vocab for t in continued):
        raise ValueError(f"continue_tokens hold ids outside this model's vocabulary of {n_vocab}")
    tokens += list(continued)
    n_ctx = runner.spec.n_ctx
    if len(tokens) > n_ctx or len(tokens) == n_ctx and not continued:
        raise ContextLengthExceeded(f"prompt is {len(tokens)} tokens; the context window is {n_ctx} tokens")
    return tokens


def generate(runner: Runner, request: "InferenceRequest", cancel: threading.Event, result: Generation,
             lora: Lora = (), cache_prompt: bool = True) -> Iterator[Piece]:
    """Yield Pieces of one request (inference/request.py's InferenceRequest) on
    ``runner``, filling ``result`` (a Generation). ``cancel`` (threading.Event)
    ends it within one token: the runner's request is closed and its slot
    freed. ``lora``: [{"id", "scale"}] for the runner; ``cache_prompt``: reuse
    the slot's KV cache (a tower always does; off, the prompt is evaluated
    afresh). Raises ValueError, ContextLengthExceeded, RunnerError."""
    if request.tools and runner.supports_tools:
        yield from _chat(runner, request, cancel, result, lora)
    elif request.tools:
        yield from _json_answer(runner, request, cancel, result, lora, cache_prompt)
    else:
        yield from _complete(runner, request, cancel, result, lora, request.messages, request.json_schema,
                             cache_prompt)


def _complete(runner: Runner, request: "InferenceRequest", cancel: threading.Event, result: Generation, lora: Lora,
              messages: list[dict[str, Any]] | None, json_schema: dict[str, Any] | None,
              cache_prompt: bool) -> Iterator[Piece]:
    """Text through the runner's /completion, from prompt tokens (see the module doc)."""
    started = time.perf_counter()
    tokens = prompt_tokens(runner, request.prompt, messages, request.continue_tokens)
    result.prompt_tokens = len(tokens)
    max_tokens = min(request.sampling.max_tokens, runner.spec.n_ctx - len(tokens))
    if max_tokens <= 0:  # a continuation whose first tower died after its last token: nothing to add
        return
    body: dict[str, Any] = {"prompt": tokens, "n_predict": max_tokens, "return_tokens": True,
                            "cache_prompt": cache_prompt, "return_progress": True, **request.sampling.to_runner()}
    if request.continue_tokens:
        body["id_slot"] = _replay(runner, tokens, len(request.continue_tokens), cancel)
    if json_schema is not None:
        body["json_schema"] = json_schema
    if request.logprobs:
        body["n_probs"] = request.logprobs
    if lora:
        body["lora"] = list(lora)
    if runner.spec.draft and not request.speculative:
        body["speculative.type"] = "none"
    # Until the first token the runner reads the prompt: a long one on a slow (or split) model takes a while.
    stream = runner.stream("/completion", body, timeout=runner.stream_timeout_s + PROMPT_TOKEN_S * len(tokens))
    seen = 0
    with _closes_on(cancel, stream):
        for event in stream:
            if event.get("stop"):
                _finish(result, event, started)
                break
            n = event.get("tokens_predicted", seen)
            if n <= seen:
                continue  # prompt progress, not a token
            if result.ttft_s == 0.0:
                result.ttft_s = time.perf_counter() - started
                stream.settimeout(runner.stream_timeout_s)
            piece = _piece(runner, event, n - seen)
            seen = n
            result.completion_tokens = n
            yield piece
    if cancel.is_set():
        result.finish_reason = "cancelled"


def _json_answer(runner: Runner, request: "InferenceRequest", cancel: threading.Event, result: Generation,
                 lora: Lora, cache_prompt: bool) -> Iterator[Piece]:
    """A request with tools for a template without tools: one JSON answer
    (tools.py), given out as its text and tool-call deltas while it grows.
    Tokens that add neither (the JSON around them) count in the next piece."""
    assert request.messages is not None and request.tools  # parse(): tools come with messages
    messages, schema = tools.prompt(request.messages, request.tools, request.tool_choice)
    answer = tools.Answer()
    logprobs: list[dict[str, Any]]
    n, logprobs = 0, []  # of the tokens not given out yet
    for piece in _complete(runner, request, cancel, result, lora, messages, schema, cache_prompt):
        n, logprobs = n + piece.n, logprobs + piece.logprobs
        text, calls = answer.feed(piece.data.decode("utf-8", "replace"))
        if text or calls:
            yield Piece(text.encode("utf-8", "replace"), [], n, logprobs, calls, exact=False)
            n, logprobs = 0, []
    text, calls = answer.end()
    if text or calls or n:
        yield Piece(text.encode("utf-8", "replace"), [], n, logprobs, calls, exact=False)
    if answer.called and result.finish_reason == "stop":
        result.finish_reason = "tool_calls"


def _replay(runner: Runner, tokens: list[int], continued: int, cancel: threading.Event) -> int:
    """Bring a slot to ``tokens`` the way an uninterrupted run did: the prompt
    in batches, each of its last ``continued`` tokens (generated ones) on its
    own. The last bits of a decode depend on the batch it was in, and at
    temperature 0 one flipped argmax changes the rest of the text; evaluated
    as one batch, a continuation matched the uninterrupted run in 20 of 29
    cases measured, replayed one by one in 29 of 29 (bench/concurrency.py
    --determinism). Returns the slot, which the generation then uses. The
    runner's other streams share its batches meanwhile, so only a runner
    serving this stream alone gives the same bits."""
    slot = runner.call("POST", "/completion", {"prompt": tokens[:len(tokens) - continued], "n_predict": 0,
                                               "cache_prompt": True}).get("id_slot", -1)
    for end in range(len(tokens) - continued + 1, len(tokens)):
        if cancel.is_set():
            break
        runner.call("POST", "/completion", {"prompt": tokens[:end], "n_predict": 0, "cache_prompt": True,
                                            "id_slot": slot})
    return slot


def _piece(runner: Runner, event: dict[str, Any], n: int) -> Piece:
    data, ids = event.get("content", "").encode("utf-8"), list(event.get("tokens") or ())
    if len(ids) < n and data:  # a character that took several tokens: see the module doc
        repaired = runner.call("POST", "/tokenize", {"content": data.decode("utf-8"), "add_special": False,
                                                     "parse_special": False})["tokens"]
        back = runner.call("POST", "/detokenize", {"tokens": repaired})["content"]
        if back.encode("utf-8") != data:
            return Piece(data, [], n, logprobs=_logprobs(event.get("completion_probabilities")), exact=False)
        ids = repaired
    return Piece(data, ids, n, logprobs=_logprobs(event.get("completion_probabilities")))


def _logprobs(probs: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The runner's per-token probabilities as [{token, logprob, bytes, top: [...]}]."""
    out = []
    for p in probs or ():
        top = [{"token": t.get("token", ""), "logprob": t.get("logprob", 0.0), "bytes": t.get("bytes") or []}
               for t in p.get("top_logprobs") or ()]
        out.append({"token": p.get("token", ""), "logprob": p.get("logprob", 0.0), "bytes": p.get("bytes") or [],
                    "top": top})
    return out


def _finish(result: Generation, event: dict[str, Any], started: float) -> None:
    timings = event.get("timings") or {}
    result.finish_reason = FINISH.get(event.get("stop_type") or "", "stop")
    result.completion_tokens = event.get("tokens_predicted", result.completion_tokens)
    result.cached_tokens = int(timings.get("cache_n") or 0)
    _timed(result, timings)
    result.draft_tokens = int(timings.get("draft_n") or 0)
    result.draft_accepted = int(timings.get("draft_n_accepted") or 0)
    if result.ttft_s == 0.0 and result.completion_tokens:
        result.ttft_s = time.perf_counter() - started


def _timed(result: Generation, timings: dict[str, Any]) -> None:
    """The runner's own times and rate from its ``timings`` map."""
    result.tokens_per_s = float(timings.get("predicted_per_second") or 0.0)
    result.prompt_s = float(timings.get("prompt_ms") or 0.0) / 1000
    result.decode_s = float(timings.get("predicted_ms") or 0.0) / 1000


def _chat(runner: Runner, request: "InferenceRequest", cancel: threading.Event, result: Generation,
          lora: Lora) -> Iterator[Piece]:
    """A request with tools, through the runner's OpenAI chat endpoint (its
    tool-call parser for the model's template)."""
    started = time.perf_counter()
    body: dict[str, Any] = {"messages": request.messages, "tools": request.tools,
                            "max_tokens": request.sampling.max_tokens, "stream_options": {"include_usage": True},
                            **request.sampling.to_runner()}
    if request.tool_choice is not None:
        body["tool_choice"] = request.tool_choice
    if request.json_schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"schema": request.json_schema}}
    if request.logprobs:
        body.update(logprobs=True, top_logprobs=request.logprobs)
    if lora:
        body["lora"] = list(lora)
    stream = runner.stream("/v1/chat/completions", body)
    with _closes_on(cancel, stream):
        for event in stream:
            usage = event.get("usage")
            if usage:
                result.prompt_tokens = usage.get("prompt_tokens", 0)
                result.completion_tokens = usage.get("completion_tokens", 0)
                _timed(result, event.get("timings") or {})
            for choice in event.get("choices") or ():
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
                delta = choice.get("delta") or {}
                text, calls = delta.get("content") or "", delta.get("tool_calls") or []
                lp = _logprobs((choice.get("logprobs") or {}).get("content"))
                if text or calls:
                    if result.ttft_s == 0.0:
                        result.ttft_s = time.perf_counter() - started
                    yield Piece(text.encode("utf-8"), [], 1 if text else 0, logprobs=lp, tool_calls=calls,
                                exact=False)
    if cancel.is_set():
        result.finish_reason = "cancelled"


class _closes_on:
    """Closes ``stream`` as soon as ``cancel`` is set, while inside the block."""

    def __init__(self, cancel: threading.Event, stream: RunnerStream) -> None:
        self.cancel, self.stream, self.done = cancel, stream, threading.Event()

    def __enter__(self) -> "_closes_on":
        threading.Thread(target=self._watch, name="rngrid-cancel-watch", daemon=True).start()
        return self

    def _watch(self) -> None:
        while not self.done.is_set():
            if self.cancel.wait(0.1):
                self.stream.close()
                return

    def __exit__(self, *exc: object) -> Literal[False]:
        self.done.set()
        self.stream.close()
        return False
