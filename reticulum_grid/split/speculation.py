"""How far a split model's draft runs ahead of it: the longer the round trip to its workers, the more tokens.

llama.cpp's speculative decoding (common/speculative.cpp, draft-simple) lets
the draft model, run whole on the coordinator, propose up to ``n_max`` tokens;
the split model then checks them all in one batch, which costs the same
round trips to the workers as one token does (measured: about 3 round trips
a verification at 44 ms RTT, bench/split.py --profile tailnet, the runner's
log). Its default ``n_max`` of 3 (common/common.h) is made for one machine,
where a verification is cheap: across a link, one verification of 4 tokens
took 168 ms, 130 ms of it waiting for the workers, so a token cost 42 ms
against 15 ms on one tower.

A drafted token costs the coordinator one decode of the draft model (its
bytes over the coordinator's memory bandwidth, split/estimate.py's figure:
SmolLM2-135M, 98 MB, at the CPU prior of 10 GB/s is 9.8 ms; measured 9.6 ms
on one thread). Drafting pays while it takes less than the round trips it
saves, so the draft runs ahead for about the round trips' time:
ROUND_TRIPS_PER_STAGE x RTT over one drafted token's cost, at least
llama.cpp's default and at most MAX_DRAFT. A draft that is unsure stops
early (P_MIN), so a long draft costs little when the draft agrees less.
"""

import math

from reticulum_grid.split.estimate import ROUND_TRIPS_PER_STAGE

#: llama.cpp's own draft length (common/common.h, ``n_max = 3``): the least we ask for.
MIN_DRAFT = 3
#: The most tokens one verification carries: llama.cpp checks them in one batch
#: (at most its n_batch, 2048), and past this the draft's own time dominates.
MAX_DRAFT = 32
#: A drafted token whose probability under the draft is below this ends the
#: draft (``--spec-draft-p-min``; llama.cpp's default is 0, drafting blind to the
#: end; 0.75 was its default before common_params_speculative_draft, common.h).
P_MIN = 0.75


def draft_max(rtt_s: float, draft_bytes: int, bandwidth: float) -> int:
    """Tokens a draft of ``draft_bytes`` on a coordinator reading ``bandwidth``
    bytes/s should propose per verification when its slowest worker is
    ``rtt_s`` seconds away (MIN_DRAFT..MAX_DRAFT; MIN_DRAFT for no workers)."""
    token_s = max(draft_bytes, 1) / max(bandwidth, 1.0)
    ahead = math.ceil(ROUND_TRIPS_PER_STAGE * max(rtt_s, 0.0) / token_s)
    return min(max(ahead, MIN_DRAFT), MAX_DRAFT)


def ceiling(split_tokens_per_s: float, rtt_s: float, draft_bytes: int, bandwidth: float) -> tuple[int, float]:
    """(tokens the draft proposes a verification, tokens/s at most) for a split
    estimated at ``split_tokens_per_s`` without a draft, whose coordinator
    (reading ``bandwidth`` bytes/s) drafts with a model of ``draft_bytes`` for
    workers up to ``rtt_s`` seconds away: the figure where every drafted token
    is accepted, so each verification, one split pass (a GPU checks a batch of
    tokens in about a token's time), gives draft_max + 1 tokens after
    draft_max drafted ones. Acceptance is what the draft and its model make of
    each text (each usage says it: draft_tokens, draft_accepted), so this is
    an upper bound; on a CPU a checked token costs nearly what a decoded one
    does, and the gain is smaller."""
    ahead = draft_max(rtt_s, draft_bytes, bandwidth)
    per_verification = ahead * max(draft_bytes, 1) / max(bandwidth, 1.0) + 1.0 / max(split_tokens_per_s, 1e-9)
    return ahead, (ahead + 1) / per_verification
