"""Comparison tolerances shared by the tests, scaled to the values compared.

XLA on another CPU (or with another batch shape, chunking or sharding) sums in another
order, so two float32 evaluations of one quantity differ by a few ulps of the magnitudes
involved. A fixed atol that is generous near 1 is only ~1 ulp for values near 10 (one ulp
of a float32 in [8, 16) is 2^-20 ~ 9.5e-7): such a test passes on one CPU and fails on the
next. The helpers here scale the tolerance with the values instead.
"""
import numpy as np


def close(actual, expected, atol=1e-5):
    """`|actual - expected| <= atol * (1 + |expected|)` elementwise.

    `atol` is meant for values of size <= 1 (1e-6 ~ 8 float32 ulps at 1, 1e-5 ~ 84); a value
    of size |x| carries rounding errors |x| times larger, so the same ulp count there is
    atol * |x| (relative). atol=0 asks for exact equality.
    """
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=atol, atol=atol)


LOGPROB_ULPS = 8
"""Float32 log_softmax(x)_i = (x_i - max x) - log sum_j exp(x_j - max x). Its error is the
rounding of the two terms (each <= 1/2 ulp of |log p_i|, which bounds both: they have the
same sign) plus the relative error of the sum of V positive terms, a few eps (pairwise
partial sums): about one ulp of log V (8 eps for V >= 2981). Measured against float64 on
this CPU (tests/test_tolerances.py): <= 2 ulps of max(|log p|, log V) for logit scales
0.1-20 and V = 49152. Two evaluations compared with each other: up to twice that; 8 leaves
2x headroom."""


def logprob_atol(logprobs, vocab_size: int, ulps: int = LOGPROB_ULPS) -> float:
    """Tolerance for two float32 evaluations of log-probs over `vocab_size` tokens from the
    same logits: `ulps` ulps of max(max |logprobs|, log V) (see LOGPROB_ULPS)."""
    scale = max(float(np.abs(np.asarray(logprobs)).max(initial=0.0)), np.log(vocab_size))
    return ulps * float(np.spacing(np.float32(scale)))


def greedy_agreement(got, want, margin_at, max_margin: float) -> int:
    """Length of the common prefix of two greedy token sequences from two implementations.

    Where they first differ, the two implementations' logits (each within `max_margin` / 2
    of the other's, by a separate parity check) must have been a near tie: `margin_at(j)`,
    our largest logit at step j minus our logit of `want[j]` (given the common prefix
    want[:j]), must be <= max_margin. Beyond that step the sequences are conditioned on
    different tokens, so nothing later is compared.

    Raises:
        AssertionError: they differ at a step whose margin is larger than `max_margin`.
    """
    got, want = list(got), list(want)
    n = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    if n < min(len(got), len(want)):
        margin = float(margin_at(n))
        assert 0.0 <= margin <= max_margin, (
            f"greedy token {n} differs ({got[n]} vs reference {want[n]}) with a logit margin "
            f"of {margin:.3e} > {max_margin:.1e}: not a near tie")
    else:
        assert len(got) == len(want), (got, want)  # one stopped early: not a tie
    return n
