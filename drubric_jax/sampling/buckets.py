"""Prompt length buckets and left padding: a new prompt length reuses a compiled program.

Axis legend: B rows, P padded prompt length.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

# Length buckets: powers of two up to BUCKET_POW2_UNTIL, then multiples of BUCKET_STEP. A
# new length reuses a compiled program, and a long prompt wastes at most BUCKET_STEP - 1
# padding tokens instead of up to half the bucket (a 690-token generator prompt: 768, not
# 1024).
BUCKET_POW2_UNTIL = 512
BUCKET_STEP = 128


def bucket_length(n: int, minimum: int = 16, step: int = BUCKET_STEP,
                  pow2_until: int = BUCKET_POW2_UNTIL) -> int:
    """The bucket of a length n: the smallest power of two >= max(n, minimum) while that is
    <= pow2_until, else the smallest multiple of `step` >= n."""
    n = max(int(n), int(minimum))
    # The smallest power of two >= n.
    pow2 = 1 << max(0, n - 1).bit_length()
    return pow2 if pow2 <= pow2_until else step * -(-n // step)


def left_pad(prompts: Sequence[Sequence[int]], length: int, pad_id: int,
             rows: Optional[int] = None):
    """Left-pads token lists to `length`: (tokens int32[B, length], mask bool[B, length]).

    Args:
        prompts: the token lists.
        length: P, the padded length.
        pad_id: the id of padding positions.
        rows: B (default len(prompts)); rows past the prompts are filler (dropped by the
            caller): one pad token in the last column, masked in, so that no row attends
            to nothing.

    Raises:
        ValueError: an empty prompt, one longer than `length`, or fewer rows than prompts.
    """
    rows = len(prompts) if rows is None else int(rows)
    if rows < len(prompts):
        raise ValueError(f"{rows} rows for {len(prompts)} prompts")
    tokens = np.full((rows, length), pad_id, np.int32)
    mask = np.zeros((rows, length), bool)
    for i, p in enumerate(prompts):
        if not 0 < len(p) <= length:
            raise ValueError(f"prompt {i} has {len(p)} tokens; must be 1..{length}")
        # Left padding: every row's last prompt token sits in the last column, so each decode
        # step writes the same cache slot for all rows.
        tokens[i, length - len(p):] = p
        mask[i, length - len(p):] = True
    mask[len(prompts):, -1] = True  # filler rows
    return tokens, mask


# KV-cache segments (`cache_schedule`): segment j of m ends after N / 2^(m-1-j) new tokens,
# rounded up to a multiple of SEGMENT_ALIGN when the first segment has that many (cache
# shapes that tile evenly on accelerators). "auto" uses AUTO_SEGMENTS of them when N is at
# least AUTO_MIN_NEW_TOKENS and half the prompt bucket.
AUTO_SEGMENTS = 4
AUTO_MIN_NEW_TOKENS = 4096
SEGMENT_ALIGN = 128


def auto_cache_segments(prompt_len: int, max_new_tokens: int, per_layer: bool) -> int:
    """Segments "auto" (`cache_schedule(segments=0)`) picks: 4 when N >= 4096 and
    N >= P / 2 and the decode loop runs on per-layer caches (`models.per_layer_decode`:
    CPU and GPU), else 1.

    Why: with the ends N/8, N/4, N/2, N a step reads P + 0.67 N slots on average instead of
    P + N: 10% fewer or more when N >= P / 2 (the generator's 24K-token prompts with 8K
    new tokens stay at one). Per-layer caches grow by chunks (`models.add_chunk`), so the
    call holds S_0 + P + N slots against 2 (P + N) with one segment. Each segment is one
    more compile of the decode step, paid once per shape, so short generations keep one.
    Stacked caches (TPU) grow by a copy (the old and the new cache at once), so "auto"
    keeps one there.
    """
    if (not per_layer or max_new_tokens < AUTO_MIN_NEW_TOKENS
            or 2 * max_new_tokens < prompt_len):
        return 1
    return AUTO_SEGMENTS


def cache_schedule(prompt_len: int, max_new_tokens: int, segments: int,
                   per_layer: bool = True) -> tuple:
    """KV-cache slots of each decode segment: (S_0, S_1, ..., S_{m-1} = P + N).

    The prefill makes a cache of S_0 slots; the decode loop runs segment j while the next
    slot to write is below S_j, then adds S_{j+1} - S_j slots (`models.add_chunk`,
    `sampling.decode_segments`). A step of segment j reads S_j slots, not P + N. Segment j
    ends after ceil(N / 2^(m-1-j)) new tokens (the last after N), so each segment is as
    long as all new tokens before it, and a step reads on average
    P + N (1/2 + 1/8 + 1/32 + ...) slots, P + 0.67 N at m = 4 (`mean_slots_read`).

    Args:
        prompt_len: P, the prompt bucket.  max_new_tokens: N >= 1.
        segments: m >= 1, or 0 for `auto_cache_segments`. Ends are rounded up to a
            multiple of SEGMENT_ALIGN when N / 2^(m-1) >= SEGMENT_ALIGN; segments that
            would end at the same slot are merged, so fewer than m may come back.
        per_layer: whether the decode loop runs on per-layer caches (for "auto").

    Raises:
        ValueError: segments < 0, or N < 1.
    """
    if segments < 0:
        raise ValueError(f"cache_segments must be >= 0 (0 = auto), got {segments}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    m = segments or auto_cache_segments(prompt_len, max_new_tokens, per_layer)
    align = SEGMENT_ALIGN if max_new_tokens >= SEGMENT_ALIGN << (m - 1) else 1
    ends = []
    for j in range(m):
        end = -(-max_new_tokens // (1 << (m - 1 - j)))          # ceil(N / 2^(m-1-j))
        end = min(max_new_tokens, align * -(-end // align))
        if not ends or end > ends[-1]:
            ends.append(end)
    return tuple(prompt_len + e for e in ends)


def mean_slots_read(schedule: tuple, prompt_len: int, max_new_tokens: int) -> float:
    """Cache slots a decode step reads, averaged over N steps under `schedule`
    (`cache_schedule`): the step writing slot P + t reads S_j, the first S_j > P + t."""
    total, start = 0, prompt_len
    for slots in schedule:
        total += slots * (min(slots, prompt_len + max_new_tokens) - start)
        start = slots
    return total / max_new_tokens
