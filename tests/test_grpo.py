"""Tests for drubric_jax.rl.grpo: Eq. 23 loss, k3 KL, masks, log-probs (METHOD 4, 11)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from drubric_jax import sampling
from drubric_jax.rl import grpo
from drubric_jax.rl import logprobs
from drubric_jax.sampling.constrained import pack_bitmask
from tolerances import close

PROPERTY = settings(max_examples=30, deadline=None)


def loss_and_grad(logp_new, logp_old, logp_ref, adv, mask, **kw):
    def f(lp):
        return grpo.grpo_loss(lp, logp_old, logp_ref, adv, mask, **kw)[0]
    return jax.value_and_grad(f)(jnp.asarray(logp_new, jnp.float32))


JIT_LOSS_AND_GRAD = jax.jit(loss_and_grad, static_argnames=("clip_eps", "beta", "aggregation"))


# --- completion mask ------------------------------------------------------------------

class ForcedTokens:
    """A sampler constraint (`sampling.generate(constraint=...)`) that allows exactly one
    token per row and step: row i emits forced[i][0], forced[i][1], ... (then anything)."""

    def __init__(self, forced, vocab_size):
        self.forced, self.vocab_size = [list(f) for f in forced], vocab_size

    def reset(self, batch):
        self.step = 0

    def fill(self, bitmask, rows):
        out = np.ones((len(self.forced), self.vocab_size), bool)
        for i, f in enumerate(self.forced):
            if self.step < len(f):
                out[i] = False
                out[i, f[self.step]] = True
        bitmask[:] = pack_bitmask(out)

    def finished(self):
        return np.zeros(len(self.forced), bool)

    def advance(self, tokens, live):
        self.step += 1


def test_case_04_completion_mask_pad_equals_eos(load_case, tiny_model):
    """The sampler's mask (the one the loss uses) covers every token up to and including the
    first EOS when pad == EOS; a row without EOS is kept whole and flagged truncated."""
    case = load_case("case-04")
    eos = 2
    ids = [[11, 12, 2, 2, 2], [13, 2, 2, 2, 2], [14, 15, 16, 17, 18]]
    adv = [1.0, -1.0, 0.5]
    want_mask = [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    want_len, want_trunc = [3, 2, 5], [False, False, True]
    want_grad = [[-0.111111, -0.111111, -0.111111, 0.0, 0.0],
                 [0.166667, 0.166667, 0.0, 0.0, 0.0],
                 [-0.033333] * 5]
    if case is not None:
        inp = case["input"]
        eos, ids, adv = inp["eos_id"], inp["completion_ids"], inp["advantages"]
        assert inp["pad_id"] == eos
        want_mask = case["expected"]["completion_mask"]
        want_len, want_trunc = case["expected"]["lengths"], case["expected"]["truncated"]
        want_grad = case["expected"]["d_loss_d_logp_new"]
    cfg, params = tiny_model
    rollout = sampling.generate(params, cfg, [[5, 6, 7]] * len(ids), key=jax.random.PRNGKey(0),
                                max_new_tokens=len(ids[0]), stop_ids=[eos], pad_id=eos,
                                constraint=ForcedTokens(ids, cfg.vocab_size))
    assert rollout.tokens.tolist() == ids  # post-EOS filler is the pad id == EOS id
    assert rollout.mask.astype(int).tolist() == want_mask
    assert rollout.lengths.tolist() == want_len
    assert rollout.truncated.tolist() == want_trunc
    assert float(np.mean(rollout.lengths[:2])) == 2.5
    # On-policy first step: sampler log-probs equal the current ones (ratio 1).
    logp = np.full((3, 5), -0.7, np.float32)
    _, grad = loss_and_grad(logp, logp, None, np.array(adv), rollout.mask, beta=0.0)
    close(grad, want_grad, 1e-6)


# --- k3 KL ----------------------------------------------------------------------------

def test_case_03_k3_kl_value_direction_gradient(load_case):
    case = load_case("case-03")
    lp, lr, beta = [-1.0, -0.5], [-2.0, -0.3], 0.01
    want_tok, want_mean = [0.367879, 0.021403], 0.194641
    want_grad = [0.31606, -0.110701]
    want_beta_grad = [0.003161, -0.001107]
    if case is not None:
        inp = case["input"]
        lp, lr, beta = inp["logp_policy"], inp["logp_ref"], inp["beta"]
        want_tok, want_mean = case["expected"]["k3_per_token"], case["expected"]["k3_mean"]
        want_grad = case["expected"]["d_k3_mean_d_logp_policy"]
        want_beta_grad = case["expected"]["d_beta_k3_mean_d_logp_policy"]
    lp, lr = np.array(lp, np.float32), np.array(lr, np.float32)
    k3 = grpo.k3_kl(lp, lr)
    close(k3, want_tok, 1e-6)
    assert np.all(np.asarray(k3) >= 0)
    close(jnp.mean(k3), want_mean, 1e-6)
    grad = jax.grad(lambda x: jnp.mean(grpo.k3_kl(x, lr)))(jnp.asarray(lp))
    close(grad, want_grad, 1e-6)
    # Through the full loss with A = 0: only the KL term has a gradient.
    mask = np.ones((1, 2), bool)
    loss, g = loss_and_grad(lp[None], lp[None], lr[None], np.zeros(1), mask, beta=beta)
    close(loss, beta * want_mean, 1e-7)
    close(g[0], want_beta_grad, 1e-6)


@pytest.mark.parametrize("name", sorted(grpo.KL_ESTIMATORS))
def test_kl_estimators_values_and_loss_selection(name):
    """k1 = logp - ref, k2 = (logp - ref)^2 / 2, k3 = exp(d) - d - 1 (d = ref - logp), all
    clamped; `grpo_loss(kl_estimator=...)` uses the chosen one (A = 0: loss = beta KL)."""
    lp = np.array([-1.0, -0.5, -3.0], np.float32)
    lr = np.array([-2.0, -0.3, -3.0], np.float32)
    d = lr - lp
    want = {"k1": -d, "k2": 0.5 * d * d, "k3": np.exp(d) - d - 1.0}[name]
    close(grpo.KL_ESTIMATORS[name](lp, lr), want, 1e-6)
    mask = np.ones((1, 3), bool)
    loss, _ = loss_and_grad(lp[None], lp[None], lr[None], np.zeros(1), mask, beta=0.5,
                            kl_estimator=name)
    close(loss, 0.5 * want.mean(), 1e-6)
    # A huge log-ratio is clamped to 20 before any exp: finite for every estimator.
    big = grpo.KL_ESTIMATORS[name](np.array([0.0]), np.array([-1e9]))
    assert np.all(np.isfinite(big))
    with pytest.raises(ValueError, match="kl_estimator"):
        grpo.grpo_loss(lp[None], lp[None], lr[None], np.zeros(1), mask, kl_estimator="k9")


def test_k3_clamped_and_finite():
    k3 = grpo.k3_kl(np.array([0.0, -1e9, 0.0]), np.array([-1e9, 0.0, 0.0]))
    want = [math.exp(-20) + 20 - 1, math.exp(20) - 20 - 1, 0.0]
    np.testing.assert_allclose(np.asarray(k3), want, rtol=1e-6, atol=1e-6)
    assert np.all(np.isfinite(np.asarray(k3)))


# --- clipped surrogate / loss ------------------------------------------------------------

def test_case_07_token_level_clipping_against_stored_logprobs(load_case):
    case = load_case("case-07")
    clip_eps = 0.2
    tokens = [(-0.5, -1.0, 1.0), (-0.5, -1.0, -1.0), (-1.5, -1.0, 1.0), (-1.5, -1.0, -1.0)]
    want = [(1.648721, -1.2, 0.0, True), (1.648721, 1.648721, 1.648721, False),
            (0.606531, -0.606531, -0.606531, False), (0.606531, 0.8, 0.0, True)]
    if case is not None:
        clip_eps = case["input"]["clip_eps"]
        tokens = [(t["logp_new"], t["logp_old"], t["advantage"]) for t in case["input"]["tokens"]]
        want = [(t["ratio"], t["loss"], t["d_loss_d_logp_new"], t["clipped"])
                for t in case["expected"]["per_token"]]
    new = np.array([[t[0]] for t in tokens], np.float32)  # one token per row: [4, 1]
    old = np.array([[t[1]] for t in tokens], np.float32)
    adv = np.array([t[2] for t in tokens], np.float32)
    obj, clipped = grpo.clipped_surrogate(new, old, adv, clip_eps)
    close(-obj[:, 0], [w[1] for w in want], 1e-6)
    assert np.asarray(clipped[:, 0]).tolist() == [w[3] for w in want]
    mask = np.ones((4, 1), bool)
    loss, grad = loss_and_grad(new, old, None, adv, mask, clip_eps=clip_eps, beta=0.0)
    close(loss, np.mean([w[1] for w in want]), 1e-6)
    close(grad[:, 0] * 4, [w[2] for w in want], 1e-5)  # mean over 4 rows
    _, metrics = grpo.grpo_loss(new, old, None, adv, mask, clip_eps, 0.0)
    close(metrics["clip_fraction"], 0.5)
    close(metrics["ratio_mean"], np.mean([w[0] for w in want]), 1e-6)
    assert np.max(np.abs(np.asarray(grad[:, 0]) * 4 - np.array([-1, 1, -1, 1]))) > 0.3


def test_case_05_masked_logprobs_no_nan(load_case):
    case = load_case("case-05")
    inp = {"logp_new": [[-1.0, -0.5, -250.0, 0.0]], "logp_old": [[-1.0, -0.5, 0.0, -250.0]],
           "logp_ref": [[-1.2, -0.4, 0.0, 0.0]], "mask": [[1, 1, 0, 0]],
           "advantages": [1.0], "clip_eps": 0.2, "beta": 0.01}
    want_loss, want_grad = -0.99988, [-0.499094, -0.500526, 0.0, 0.0]
    if case is not None:
        inp = case["input"]
        want_loss, want_grad = case["expected"]["loss"], case["expected"]["d_loss_d_logp_new"]
    keys = ("logp_new", "logp_old", "logp_ref", "advantages")
    arr = {k: np.array(inp[k], np.float32) for k in keys}
    mask = np.array(inp["mask"], bool)
    loss, grad = loss_and_grad(arr["logp_new"], arr["logp_old"], arr["logp_ref"],
                               arr["advantages"], mask, clip_eps=inp["clip_eps"], beta=inp["beta"])
    close(loss, want_loss, 1e-6)
    close(grad[0], want_grad, 1e-6)
    assert np.all(np.isfinite(np.asarray(grad)))
    # Worse garbage: -inf, NaN and +inf at masked positions change nothing.
    for junk in (-np.inf, np.nan, np.inf, -1e9):
        bad = {k: v.copy() for k, v in arr.items()}
        for k in ("logp_new", "logp_old", "logp_ref"):
            bad[k][0, 2:] = junk
        loss2, grad2 = JIT_LOSS_AND_GRAD(
            bad["logp_new"], bad["logp_old"], bad["logp_ref"], bad["advantages"], mask,
            clip_eps=inp["clip_eps"], beta=inp["beta"])
        close(loss2, want_loss, 1e-6)
        close(grad2[0], want_grad, 1e-6)


def test_case_06_loss_aggregation(load_case):
    case = load_case("case-06")
    mask, adv = [[1, 1, 0, 0], [1, 1, 1, 1]], [1.0, -1.0]
    want_loss, want_grad = 0.0, [[-0.25, -0.25, 0.0, 0.0], [0.125] * 4]
    if case is not None:
        mask, adv = case["input"]["mask"], case["input"]["advantages"]
        assert case["input"]["max_len_for_dr_grpo"] == 4
        want_loss = case["expected"]["loss_per_response_norm"]
        want_grad = case["expected"]["d_loss_d_logp_new"]
    mask, adv = np.array(mask, bool), np.array(adv, np.float32)
    logp = np.full(mask.shape, -1.3, np.float32)
    loss, grad = loss_and_grad(logp, logp, None, adv, mask, beta=0.0)
    close(loss, want_loss, 1e-6)
    close(grad, want_grad, 1e-6)
    # The library variants are options with their own, different numbers.
    loss, grad = loss_and_grad(logp, logp, None, adv, mask, beta=0.0, aggregation="token_mean")
    close(loss, 1 / 3, 1e-6)
    close(grad, [[-1 / 6, -1 / 6, 0, 0], [1 / 6] * 4], 1e-6)
    loss, grad = loss_and_grad(logp, logp, None, adv, mask, beta=0.0, aggregation="dr_grpo")
    close(loss, 0.25, 1e-6)
    close(grad, [[-0.125, -0.125, 0, 0], [0.125] * 4], 1e-6)


def test_grpo_loss_metrics_and_empty_rows():
    new = np.array([[-1.0, -2.0], [-0.5, 9.0]], np.float32)
    old = np.array([[-1.0, -2.0], [-0.5, 9.0]], np.float32)
    ref = np.array([[-2.0, -2.0], [-0.5, 9.0]], np.float32)
    mask = np.array([[1, 1], [0, 0]], bool)  # row 1 empty: must not dilute the mean
    loss, metrics = grpo.grpo_loss(new, old, ref, np.array([2.0, np.nan]), mask, 0.2, 0.1)
    k3 = math.exp(-1) + 1 - 1
    close(metrics["pg_loss"], -2.0)
    close(metrics["kl"], k3 / 2)
    close(loss, -2.0 + 0.1 * k3 / 2)
    close(metrics["num_tokens"], 2.0)
    close(metrics["clip_fraction"], 0.0)


def test_grpo_loss_argument_errors():
    x = np.zeros((1, 2), np.float32)
    with pytest.raises(ValueError):
        grpo.grpo_loss(x, x, None, np.zeros(1), np.ones((1, 2), bool), 0.2, 0.01)
    with pytest.raises(ValueError):
        grpo.grpo_loss(x, x, x, np.zeros(1), np.ones((1, 2), bool), 0.2, 0.0, "sum")


@PROPERTY
@given(hnp.arrays(np.float32, (3, 4), elements=st.floats(-5, 0, width=32)),
       hnp.arrays(np.float32, (3, 4), elements=st.floats(-5, 0, width=32)),
       hnp.arrays(bool, (3, 4)),
       hnp.arrays(np.float32, (3,), elements=st.floats(-2, 2, width=32)),
       st.sampled_from([-np.inf, np.inf, np.nan, -1e9, 250.0]),
       st.sampled_from(grpo.AGGREGATIONS))
def test_garbage_at_masked_positions_never_reaches_loss_or_grad(new, old, mask, adv, junk, agg):
    ref = old - 0.1
    clean_loss, clean_grad = JIT_LOSS_AND_GRAD(new, old, ref, adv, mask, beta=0.05, aggregation=agg)
    dirty = [np.where(mask, x, np.float32(junk)) for x in (new, old, ref)]
    loss, grad = JIT_LOSS_AND_GRAD(*dirty, adv, mask, beta=0.05, aggregation=agg)
    assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(grad)))
    assert np.all(np.asarray(grad)[~mask] == 0)
    close(loss, clean_loss, 1e-6)
    close(grad, clean_grad, 1e-6)


# --- log-probs and entropy -----------------------------------------------------------------

def test_token_logprobs_temperature():
    logits = np.array([[[1.0, 2.0, 0.5], [0.0, 0.0, 0.0]]], np.float32)  # [1, 2, 3]
    targets = np.array([[1, 2]], np.int32)
    lp = logprobs.token_logprobs_from_logits(logits, targets, 1.0)
    z = math.log(math.e ** 1 + math.e ** 2 + math.e ** 0.5)
    close(lp, [[2.0 - z, -math.log(3)]], 1e-6)
    lp2 = logprobs.token_logprobs_from_logits(logits, targets, 2.0)
    z2 = math.log(math.e ** 0.5 + math.e ** 1 + math.e ** 0.25)
    close(lp2, [[1.0 - z2, -math.log(3)]], 1e-6)
    # Greedy (T = 0) scores at temperature 1, never dividing by 0.
    close(logprobs.token_logprobs_from_logits(logits, targets, 0.0), lp, 0)
    # Per-row temperature.
    both = logprobs.token_logprobs_from_logits(np.concatenate([logits, logits]),
                                           np.concatenate([targets, targets]),
                                           np.array([1.0, 2.0]))
    close(both, np.concatenate([lp, lp2]), 1e-6)


def test_entropy_from_logits():
    logits = np.array([[[0.0, 0.0, 0.0, 0.0], [0.0, -np.inf, -np.inf, 5.0]]], np.float32)
    ent = logprobs.entropy_from_logits(logits)
    p = 1 / (1 + math.exp(-5))
    close(ent, [[math.log(4), -(p * math.log(p) + (1 - p) * math.log(1 - p))]], 1e-6)
    grad = jax.grad(lambda x: jnp.sum(logprobs.entropy_from_logits(x)))(jnp.asarray(logits))
    assert np.all(np.isfinite(np.asarray(grad)))
    close(logprobs.entropy_from_logits(logits, 0.0), ent, 0)
