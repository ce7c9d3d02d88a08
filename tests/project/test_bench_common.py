"""bench/common.py's one tokens/s formula, on named test doubles of a stream."""

import pytest

from bench.common import time_stream, tokens_per_s


class StreamDouble:
    """Yields text pieces the way client/stream.py does: ``generated`` counts the
    tokens each piece carried before it is yielded; then a usage."""

    def __init__(self, tokens_per_piece):
        self.tokens_per_piece = tokens_per_piece
        self.generated = 0

    def __iter__(self):
        for n in self.tokens_per_piece:
            self.generated += n
            yield "x" * n
        yield UsageDouble(self.generated)


class UsageDouble:
    def __init__(self, completion_tokens):
        self.completion_tokens = completion_tokens


def test_the_first_piece_counts_its_tokens_once():
    clock = iter([0.0, 1.0, 2.0, 3.0]).__next__
    # Started at 0 s; a first piece of 4 tokens at 1 s, then 1 and 1 at 2 s and 3 s: 2 tokens in 2 s.
    ttft, rate, usage = time_stream(StreamDouble([4, 1, 1]), lambda p: isinstance(p, str), 6, "double", clock=clock)
    assert (ttft, rate, usage.completion_tokens) == (1.0, 1.0, 6)


def test_no_rate_without_a_token_after_the_first_piece():
    with pytest.raises(ValueError):
        tokens_per_s(4, 1.0, 2.0, first_tokens=4)
    assert tokens_per_s(5, 1.0, 3.0) == 2.0
