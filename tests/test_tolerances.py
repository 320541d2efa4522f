"""Tests of the comparison helpers in tests/tolerances.py."""
import jax
import numpy as np
import pytest

from tolerances import LOGPROB_ULPS, close, greedy_agreement, logprob_atol


def test_close_scales_with_the_expected_magnitude():
    close(10.0 + 5e-5, 10.0, atol=1e-5)  # 5e-6 relative: within 1e-5 * (1 + 10)
    close(0.5 + 9e-6, 0.5, atol=1e-5)
    with pytest.raises(AssertionError):
        close(0.5 + 2e-5, 0.5, atol=1e-5)
    with pytest.raises(AssertionError):
        close(1.0 + 1e-12, 1.0, atol=0)  # atol=0: exact


@pytest.mark.parametrize("scale", [0.1, 1.0, 20.0])
def test_one_float32_log_softmax_is_within_half_of_logprob_atol(scale):
    """What LOGPROB_ULPS relies on: one float32 evaluation is within half of it from the exact
    (float64) values, so two evaluations are within all of it from each other."""
    vocab = 49152
    x = (np.random.default_rng(0).standard_normal((8, vocab)) * scale).astype(np.float32)
    got = np.asarray(jax.jit(jax.nn.log_softmax)(x), np.float64)
    x64 = x.astype(np.float64)
    want = x64 - x64.max(-1, keepdims=True)
    want -= np.log(np.exp(want).sum(-1, keepdims=True))
    assert np.abs(got - want).max() <= logprob_atol(want, vocab, ulps=LOGPROB_ULPS // 2)


def test_greedy_agreement_allows_only_a_near_tie_to_flip():
    margins = {2: 1e-4, 1: 0.5}
    assert greedy_agreement([5, 6, 7], [5, 6, 7], margins.get, 1e-3) == 3
    assert greedy_agreement([5, 6, 9, 1], [5, 6, 7, 8], margins.get, 1e-3) == 2  # tie at 2
    with pytest.raises(AssertionError, match="not a near tie"):
        greedy_agreement([5, 9, 7], [5, 6, 7], margins.get, 1e-3)
    with pytest.raises(AssertionError):
        greedy_agreement([5, 6], [5, 6, 7], margins.get, 1e-3)  # one stopped early
