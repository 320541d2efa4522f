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
