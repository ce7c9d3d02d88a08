"""Inference backend: one GGUF model in llama-cpp-python.

A llama context is not thread-safe, so one backend runs one generation at a
time; the tower's admission (``admission.py``) queues or refuses the rest.
Generation yields raw token bytes: a multibyte character may be split across
tokens and is reassembled by the client's incremental decoder.
"""

import contextlib
import ctypes
import os
import time
from dataclasses import dataclass

import llama_cpp
from llama_cpp import Llama
from llama_cpp.llama_chat_format import Jinja2ChatFormatter


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


class AdapterError(ValueError):
    pass


class LlamaBackend:
    """A loaded GGUF model. ``n_ctx`` in tokens; ``n_gpu_layers=-1`` offloads all
    layers when llama.cpp was built with a GPU backend; ``n_threads`` (None:
    llama-cpp-python's defaults) is used for prompt processing too, because
    llama.cpp's spinning thread barriers thrash when several contexts on one
    machine ask for more threads than it has cores (prompt processing then
    takes seconds instead of milliseconds)."""

    def __init__(self, path, n_ctx=4096, n_threads=None, n_gpu_layers=-1):
        self.path = str(path)
        with _quiet_stderr():
            self.llm = Llama(model_path=self.path, n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                             n_gpu_layers=n_gpu_layers, verbose=False)
        self.n_ctx = self.llm.n_ctx()
        self._formatter = self._chat_formatter()
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
        rendered = self._formatter(messages=messages)
        return rendered.prompt, not rendered.added_special

    def tokenize_prompt(self, prompt=None, messages=None, continued=()):
        """Prompt tokens exactly as create_completion builds them, followed by
        ``continued`` (tokens a previous run generated). Raises ValueError for
        ids outside the vocabulary and ContextLengthExceeded when they leave no
        room in the context window."""
        add_bos = True
        if messages is not None:
            prompt, add_bos = self.format_chat(messages)
        tokens = self.llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
        bos = self.llm.token_bos()
        if add_bos and self.llm._model.add_bos_token() and bos != -1:
            tokens = [bos] + tokens
        if any(t >= self.llm.n_vocab() for t in continued):
            raise ValueError(f"continue_tokens hold ids outside this model's vocabulary of {self.llm.n_vocab()}")
        tokens += list(continued)
        if len(tokens) >= self.n_ctx:
            raise ContextLengthExceeded(
                f"prompt is {len(tokens)} tokens; the context window is {self.n_ctx} tokens")
        return tokens

    def generate(self, tokens, sampling, cancel, result):
        """Yield the bytes of each generated token (stop strings held back).

        ``cancel`` is a threading.Event checked before every token; ``result`` (a
        Generation) is filled in as generation proceeds. Caller holds ``self.lock``.
        """
        started = time.perf_counter()
        result.prompt_tokens = len(tokens)
        max_tokens = min(sampling.max_tokens, self.n_ctx - len(tokens))
        stops = [s.encode("utf-8") for s in sampling.stop if s]
        self.llm.set_seed(sampling.seed if sampling.seed is not None else int.from_bytes(os.urandom(4), "big"))
        produced, sent, history, ids = bytearray(), 0, list(tokens), []
        result.finish_reason = "length"
        first_at = None
        for token in self.llm.generate(tokens, top_k=sampling.top_k, top_p=sampling.top_p,
                                       min_p=sampling.min_p, temp=sampling.temperature,
                                       repeat_penalty=sampling.repeat_penalty):
            if cancel.is_set():
                result.finish_reason = "cancelled"
                break
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
            if result.completion_tokens >= max_tokens:
                break
        if len(produced) > sent:
            yield bytes(produced[sent:]), ids
        if first_at is not None:
            result.decode_s = time.perf_counter() - first_at

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
