"""Text references for tests: the bundled model in a runner of its own, every
request from a fresh context.

A tower's runner reuses its slots' KV cache (llama-server's prompt cache), so
the same request twice may differ in the last bits, and at temperature 0 one
flipped argmax changes the rest of the text (inference/generation.py). A
reference must not depend on what ran before it: each one here is computed
with ``cache_prompt`` off, in a runner started with a tower's settings
(tests/inference/test_reference.py checks that two runs in a row agree).
"""

import threading

from reticulum_grid.inference import generation, request as inference_request
from reticulum_grid.inference.registry import MAX_AUTO_SLOTS
from reticulum_grid.inference.runner import Runner
from reticulum_grid.inference.runner_spec import RunnerSpec


class Reference:
    """``completion(prompt, max_tokens)`` and ``chat(messages, max_tokens)``: the
    text at temperature 0; ``run`` also gives the token ids and the
    Generation. ``close()`` ends the runner."""

    def __init__(self, model_path, log_path, n_ctx=4096, parallel=MAX_AUTO_SLOTS, threads=0):
        self.runner = Runner(RunnerSpec(str(model_path), n_ctx=n_ctx, parallel=parallel, threads=threads), log_path,
                             name="reference").start()

    def run(self, max_tokens, **payload):
        request = inference_request.parse({"model": "reference", "max_tokens": max_tokens, "temperature": 0.0,
                                           "stream_id": 0, **payload})
        result, pieces = generation.Generation(), []
        for piece in generation.generate(self.runner, request, threading.Event(), result, cache_prompt=False):
            pieces.append(piece)
        text = b"".join(p.data for p in pieces).decode("utf-8", "ignore")
        return text, [i for p in pieces for i in p.ids], result

    def completion(self, prompt, max_tokens):
        return self.run(max_tokens, prompt=prompt)[0]

    def chat(self, messages, max_tokens):
        return self.run(max_tokens, messages=messages)[0]

    def tokens(self, prompt=None, messages=None):
        return generation.prompt_tokens(self.runner, prompt, messages)

    def close(self):
        self.runner.close()
