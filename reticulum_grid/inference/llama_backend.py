"""Inference backend: one GGUF model in llama-cpp-python.

A llama context is not thread-safe, so one backend runs one generation at a
time; the tower's admission (``admission.py``) queues or refuses the rest.
Generation yields raw token bytes: a multibyte character may be split across
tokens and is reassembled by the client's incremental decoder.

The last bits of a llama.cpp decode depend on how tokens were batched (a
prompt batch and single-token steps use different kernels), and at
temperature 0 one flipped argmax changes the rest of the text. So every
generation brings the context to its tokens the way an uninterrupted run
does: the prompt in batches from position 0, each generated (or continued)
token on its own; cached KV entries are reused only when they were made that
same way. A tower continuing another's stream thus gives the same text.

Where a model really went is read from llama.cpp's own load report (the
"<buffer> model/KV/compute buffer size = N MiB" lines it logs for each buffer
it allocates), not deduced from ``n_gpu_layers``: see ``placement.py``.
"""

import contextlib
import ctypes
import os
import time
from dataclasses import dataclass

import jinja2
import llama_cpp
from llama_cpp import Llama
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from reticulum_grid.inference.placement import LoadError, llama_log, parse_placement


@dataclass
class Sampling:
    """Sampling options, with llama-cpp-python's create_completion defaults."""
    max_tokens: int = 256
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    seed: int | None = None
    stop: tuple = ()


@dataclass
class Generation:
    """What one generation produced. Times in seconds, rate in tokens/s."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "length"
    ttft_s: float = 0.0
    decode_s: float = 0.0

    @property
    def tokens_per_s(self):
        # Ollama's eval rate: generated tokens over the time spent generating them.
        return self.completion_tokens / self.decode_s if self.decode_s > 0 else 0.0


class ContextLengthExceeded(ValueError):
    pass


#: Tokens generated past ``max_tokens`` at most, to finish a character split
#: across tokens (a UTF-8 character is at most 4 bytes).
MAX_CHARACTER_TOKENS = 3


class AdapterError(ValueError):
    pass


class LlamaBackend:
    """A loaded GGUF model. ``n_ctx`` in tokens; ``n_gpu_layers=-1`` offloads all
    layers when llama.cpp was built with a GPU backend; ``n_threads`` (None:
    llama-cpp-python's defaults) is used for prompt processing too, because
    llama.cpp's spinning thread barriers thrash when several contexts on one
    machine ask for more threads than it has cores (prompt processing then
    takes seconds instead of milliseconds). ``tensor_split``: each GPU's
    share of the model, in llama.cpp's device order (None: llama.cpp's own
    split). ``placement`` says where llama.cpp put it. Raises LoadError."""

    def __init__(self, path, n_ctx=4096, n_threads=None, n_gpu_layers=-1, tensor_split=None):
        self.path = str(path)
        lines = []
        try:
            with _quiet_stderr(), llama_log(lines):
                self.llm = Llama(model_path=self.path, n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                                 n_gpu_layers=n_gpu_layers, tensor_split=tensor_split, verbose=False)
        except ValueError as e:
            raise LoadError(str(e), "".join(lines)) from None
        self.placement = parse_placement("".join(lines))
        # llama.cpp pads the context it allocates (to 256 tokens) while
        # llama-cpp-python sizes its token arrays by the n_ctx asked for, so
        # the window is the smaller of the two: the configured one.
        self.n_ctx = min(self.llm.n_ctx(), len(self.llm.input_ids))
        self._formatter = self._chat_formatter()
        self._prompt = None  # the prompt whose batch made the cached KV entries
        self._adapters = {}
        self._active_adapter = None

    def _chat_formatter(self):
        template = self.llm.metadata.get("tokenizer.chat_template")
        if not template:
            return None
        eos, bos = self.llm.token_eos(), self.llm.token_bos()
        return Jinja2ChatFormatter(
            template=template,
            eos_token=self.llm._model.token_get_text(eos) if eos != -1 else "",
            bos_token=self.llm._model.token_get_text(bos) if bos != -1 else "",
            stop_token_ids=[eos],
        )

    def format_chat(self, messages):
        """Render chat messages with the GGUF's own template. Returns (prompt, add_bos)."""
        if self._formatter is None:
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
            return text, True
        try:
            rendered = self._formatter(messages=messages)
        except jinja2.TemplateError as e:  # a template may refuse some conversations
            raise ValueError(f"the model's chat template refused these messages: {e}") from None
        return rendered.prompt, not rendered.added_special

    def tokenize_prompt(self, prompt=None, messages=None, continued=()):
        """Prompt tokens exactly as create_completion builds them, followed by
        ``continued`` (tokens a previous run generated). Raises ValueError for
        ids outside the vocabulary or an empty prompt (llama.cpp cannot start
        from no tokens) and ContextLengthExceeded when they leave no room in
        the context window."""
        add_bos = True
        if messages is not None:
            prompt, add_bos = self.format_chat(messages)
        tokens = self.llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
        bos = self.llm.token_bos()
        if add_bos and self.llm._model.add_bos_token() and bos != -1:
            tokens = [bos] + tokens
        if not tokens:
            raise ValueError("the prompt is empty: it must give at least one token")
        if any(t >= self.llm.n_vocab() for t in continued):
            raise ValueError(f"continue_tokens hold ids outside this model's vocabulary of {self.llm.n_vocab()}")
        tokens += list(continued)
        # A continuation may fill the window exactly: its first tower stopped there
        # ("length"), and the next one only ends the stream.
        if len(tokens) > self.n_ctx or len(tokens) == self.n_ctx and not continued:
            raise ContextLengthExceeded(
                f"prompt is {len(tokens)} tokens; the context window is {self.n_ctx} tokens")
        return tokens

    def generate(self, tokens, sampling, cancel, result, continued=0):
        """Yield the bytes of each generated token (stop strings held back).

        ``tokens`` from tokenize_prompt; its last ``continued`` tokens are ones
        a previous run generated. ``cancel`` is a threading.Event checked
        before every token; ``result`` (a Generation) is filled in as
        generation proceeds. Generation stops after ``sampling.max_tokens``
        tokens, or up to MAX_CHARACTER_TOKENS later when that token ends inside
        a UTF-8 character (as llama-cpp-python's create_completion does), so the
        text never ends in a broken character. With continued tokens,
        ``max_tokens`` may be 0 (their tower died after the last token): only a
        character they began is finished, and a whole one ends the stream at
        once, without evaluating anything. Caller holds the model.
        """
        started = time.perf_counter()
        result.prompt_tokens = len(tokens)
        room = self.n_ctx - len(tokens)
        max_tokens = min(sampling.max_tokens, room)
        stops = [s.encode("utf-8") for s in sampling.stop if s]
        self.llm.set_seed(sampling.seed if sampling.seed is not None else int.from_bytes(os.urandom(4), "big"))
        sampler = self.llm._init_sampler(top_k=sampling.top_k, top_p=sampling.top_p, min_p=sampling.min_p,
                                         temp=sampling.temperature, repeat_penalty=sampling.repeat_penalty)
        n_prompt = len(tokens) - continued
        # Bytes of the continued tokens' tail: a character they began is finished here.
        tail = min(continued, MAX_CHARACTER_TOKENS)
        before = self.llm.detokenize(list(tokens[len(tokens) - tail:]), prev_tokens=list(tokens[:len(tokens) - tail]))
        before = before if tail else b""
        produced, sent, history, ids = bytearray(), 0, list(tokens), []
        result.finish_reason = "length"
        first_at = None

        def finished():
            n = result.completion_tokens
            return n >= room or n >= max_tokens and (n >= max_tokens + MAX_CHARACTER_TOKENS or
                                                     not _ends_inside_character(before + produced))

        if finished():  # a continuation with no token left (max_tokens 0) that ends on a whole character
            return
        for token in tokens[n_prompt:]:
            sampler.accept(token)  # the repeat penalty saw them when they were generated
        self._evaluate(list(tokens), n_prompt)
        while True:
            if cancel.is_set():
                result.finish_reason = "cancelled"
                break
            token = sampler.sample(self.llm._ctx, -1)
            if llama_cpp.llama_vocab_is_eog(self.llm._model.vocab, token):
                result.finish_reason = "stop"
                break
            if first_at is None:
                first_at = time.perf_counter()
                result.ttft_s = first_at - started
            produced += self.llm.detokenize([token], prev_tokens=history)
            history.append(token)
            ids.append(token)
            result.completion_tokens += 1
            cut = _find_stop(produced, stops, sent)
            if cut is not None:
                del produced[cut:]
                result.finish_reason = "stop"
                break
            safe = len(produced) - _partial_stop_suffix(produced, stops)
            if safe > sent:
                yield bytes(produced[sent:safe]), ids
                sent, ids = safe, []
            result.decode_s = time.perf_counter() - first_at
            if finished():
                break
            self.llm.eval([token])
        if len(produced) > sent:
            yield bytes(produced[sent:]), ids
        if first_at is not None:
            result.decode_s = time.perf_counter() - first_at

    def _evaluate(self, tokens, n_prompt):
        """Bring the context to ``tokens`` as an uninterrupted run would have:
        the first ``n_prompt`` in batches from position 0, the rest one by one
        (see the module docstring), reusing cached entries made the same way.
        Leaves the last token's logits for sampling."""
        llm = self.llm
        keep = 0
        if self._prompt == tokens[:n_prompt] and llm.n_tokens >= n_prompt and \
                llm.input_ids[:n_prompt].tolist() == self._prompt:
            keep = n_prompt
            for cached, wanted in zip(llm.input_ids[n_prompt:llm.n_tokens].tolist(), tokens[n_prompt:]):
                if cached != wanted:
                    break
                keep += 1
            keep = min(keep, len(tokens) - 1)  # the last token is decoded again for its logits
        if keep < n_prompt or keep == 0:
            llm.reset()
            self._prompt = None
            llm.eval(tokens[:n_prompt])
            self._prompt, keep = tokens[:n_prompt], n_prompt
        else:
            llm.n_tokens = keep
        for token in tokens[keep:]:
            llm.eval([token])

    def set_adapter(self, path=None, scale=1.0):
        """Use a GGUF LoRA (or none) for the next generations. Raises
        AdapterError when llama.cpp cannot load it for this model."""
        wanted = (path, scale) if path else None
        if wanted == self._active_adapter:
            return
        if path:
            adapter = self._adapters.get(path)
            if adapter is None:
                adapter = llama_cpp.llama_adapter_lora_init(self.llm._model.model, path.encode("utf-8"))
                if not adapter:
                    raise AdapterError(f"llama.cpp cannot apply the adapter at {path} to this model")
                self._adapters[path] = adapter
            adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(adapter)
            code = llama_cpp.llama_set_adapters_lora(self.llm._ctx.ctx, adapters, 1, (ctypes.c_float * 1)(scale))
        else:
            code = llama_cpp.llama_set_adapters_lora(self.llm._ctx.ctx, None, 0, None)
        if code:
            raise AdapterError(f"llama.cpp refused the adapter (code {code})")
        self.llm.reset()  # cached KV entries were computed with other weights
        self._prompt = None
        self._active_adapter = wanted

    def close(self):
        for adapter in self._adapters.values():
            llama_cpp.llama_adapter_lora_free(adapter)
        self._adapters.clear()
        self.llm.close()


def _find_stop(produced, stops, sent):
    """Index where the earliest stop string starts, searching only near new bytes."""
    hits = [i for s in stops if (i := produced.find(s, max(0, sent - len(s) + 1))) >= 0]
    return min(hits) if hits else None


def _ends_inside_character(data):
    """True when ``data`` ends with the lead byte of a UTF-8 character whose
    continuation bytes are still missing."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte or ASCII: the last character starts here
            size = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
            return size > back
    return False


def _partial_stop_suffix(produced, stops):
    """Length of the longest tail of ``produced`` that could begin a stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(produced)), best, -1):
            if produced.endswith(s[:n]):
                best = n
                break
    return best


@contextlib.contextmanager
def _quiet_stderr():
    """llama.cpp prints model-load chatter to fd 2 even with verbose=False."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
