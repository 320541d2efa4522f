"""Tests of the batched sampler (`drubric_jax.sampling`) and JSON-constrained decoding.

Most tests use the `TINY` preset with random weights, or a "counting" model built from it
whose output is known exactly (zero transformer blocks, one-hot embeddings, a head that maps
token t to t + 1), so stop handling can be checked token by token. Tests marked
`real_model` load SmolLM2-135M-Instruct once through the `smollm2` fixture.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from drubric_jax import models, sampling
from drubric_jax.sampling.constrained import pack_bitmask
from drubric_jax.text import tokenizer as tok_lib
from drubric_jax.text.rubric_format import RUBRIC_JSON_SCHEMA
from drubric_jax.models import config as cfg_lib
from drubric_jax.models import llama
from tolerances import logprob_atol
from experiments import op_profile

REPO = Path(__file__).resolve().parents[1]
NEG_INF = float("-inf")


# --------------------------------------------------------------------------- helpers


def _counting_model(vocab: int = 64):
    """A model whose greedy continuation of a prompt ending in t is t+1, t+2, ... (mod V).

    Every block weight is zero, so the residual stream stays the one-hot embedding of the
    current token; the final RMSNorm scales it to sqrt(D), and the untied head puts logit
    10 * sqrt(D) = 80 on token t + 1 and 0 elsewhere.
    """
    cfg = cfg_lib.TINY.replace(vocab_size=vocab, dim=vocab, tie_embeddings=False)
    params = llama.init_params(cfg, jax.random.PRNGKey(0))
    params["layers"] = {k: (jnp.ones_like(v) if k.endswith("norm") else jnp.zeros_like(v))
                        for k, v in params["layers"].items()}
    params["embed"] = jnp.eye(vocab, dtype=jnp.float32)
    params["lm_head"] = 10.0 * jnp.roll(jnp.eye(vocab, dtype=jnp.float32), 1, axis=1)
    return cfg, params


@pytest.fixture(scope="module")
def counting():
    return _counting_model()


def _prompts(rng, lengths, vocab, insert_id=None):
    """Random prompts (ids 3..V-1); `insert_id` is placed inside each one (e.g. pad == eos)."""
    out = []
    for n in lengths:
        p = rng.integers(3, vocab, n).tolist()
        if insert_id is not None and n > 2:
            p[n // 2] = insert_id
        out.append(p)
    return out


_full_logits = jax.jit(
    lambda params, tokens, mask, cfg: models.apply(
        params, cfg, tokens, models.positions_from_mask(mask), token_mask=mask)[0],
    static_argnames="cfg")


def _recomputed_logprobs(params, cfg, prompts, out, temperature):
    """log softmax(logits / T) of every generated token, from one full forward pass over
    prompt + generated tokens (no cache). Returns float32[B, N] (0 where not in the mask)."""
    seqs = [list(p) + out.tokens[b][out.mask[b]].tolist() for b, p in enumerate(prompts)]
    length = max(len(s) for s in seqs)
    tokens, mask = sampling.left_pad(seqs, length, 0)
    logits = np.asarray(_full_logits(params, jnp.asarray(tokens), jnp.asarray(mask), cfg=cfg))
    logp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits) / temperature, axis=-1))
    want = np.zeros(out.logprobs.shape, np.float32)
    for b, p in enumerate(prompts):
        n = int(out.lengths[b])
        first = length - len(seqs[b]) + len(p) - 1  # position whose logits predict token 0
        for j in range(n):
            want[b, j] = logp[b, first + j, out.tokens[b, j]]
    return want


class _FakeConstraint:
    """Constraint that allows every token, except that rows in `block` are allowed none."""

    def __init__(self, vocab: int, block=()):
        self.vocab, self.block = vocab, set(block)

    def reset(self, batch):
        self.batch = batch

    def fill(self, bitmask, rows):
        a = np.ones((self.batch, self.vocab), bool)
        a[list(self.block)] = False
        bitmask[rows] = pack_bitmask(a)[rows]

    def finished(self):
        return np.zeros(self.batch, bool)

    def advance(self, tokens, live):
        pass


# --------------------------------------------------------------------------- case-09


CASE_09 = {  # copy of ../shared/cases/case-09.json (checked against it when present)
    "temperature_zero_case": {"logits": [1.0, 2.0, 0.5], "temperature": 0.0, "token": 1},
    "top_p_case": {"logits": [2.0, 1.0, 0.0, -1.0], "temperature": 1.0, "top_p": 0.9,
                   "kept_tokens": [0, 1, 2], "probs": [0.665241, 0.244728, 0.090031, 0.0]},
    "single_finite_case": {"logits": [0.0, NEG_INF, NEG_INF, NEG_INF], "top_p": 0.9,
                           "token": 0, "probs": [1.0, 0.0, 0.0, 0.0]},
    "all_masked_case": {"logits": [NEG_INF] * 4},
}


def test_case_09_copy_matches_shared_case(load_case):
    case = load_case("case-09")
    if case is None:
        pytest.skip("../shared not found; the hard-coded copy is used")
    inp, exp = case["input"], case["expected"]
    for name in ("temperature_zero_case", "top_p_case", "single_finite_case", "all_masked_case"):
        np.testing.assert_array_equal([float(x) for x in inp[name]["logits"]],
                                      CASE_09[name]["logits"])
    assert exp["temperature_zero_case"]["token"] == CASE_09["temperature_zero_case"]["token"]
    assert exp["top_p_case"]["kept_tokens"] == CASE_09["top_p_case"]["kept_tokens"]
    assert exp["top_p_case"]["probs"] == CASE_09["top_p_case"]["probs"]
    assert inp["top_p_case"]["top_p"] == CASE_09["top_p_case"]["top_p"]
    assert exp["single_finite_case"]["probs"] == CASE_09["single_finite_case"]["probs"]


def test_case_09_temperature_zero_is_argmax():
    c = CASE_09["temperature_zero_case"]
    method = sampling.method_from_flags(c["temperature"], top_k=2, top_p=0.5)
    assert isinstance(method, sampling.Greedy)
    logits = jnp.asarray([c["logits"]], jnp.float32)
    for m in (method, sampling.Temperature(0.0)):
        for seed in range(5):
            tok, logp, invalid = sampling.sample_logits(jax.random.PRNGKey(seed), logits, m)
            assert int(tok[0]) == c["token"]
            assert np.isfinite(np.asarray(logp)).all() and not bool(invalid[0])
            # Greedy reports temperature-1 log-probs.
            np.testing.assert_allclose(float(logp[0]),
                                       float(jax.nn.log_softmax(logits[0])[1]), rtol=1e-6)
    assert sampling.scoring_temperature(method) == 1.0


def test_case_09_top_p_keeps_nucleus():
    c = CASE_09["top_p_case"]
    method = sampling.method_from_flags(c["temperature"], top_p=c["top_p"])
    assert method == sampling.TopP(c["top_p"], c["temperature"])
    trunc = sampling.truncated_logits(jnp.asarray([c["logits"]], jnp.float32), method)
    kept = np.flatnonzero(np.isfinite(np.asarray(trunc[0]))).tolist()
    assert kept == c["kept_tokens"]
    probs = np.asarray(jax.nn.softmax(trunc, axis=-1)[0])
    assert not np.isnan(probs).any()
    np.testing.assert_allclose(probs, c["probs"], atol=1e-6)
    # Sampling never draws the dropped token 3.
    logits = jnp.tile(jnp.asarray([c["logits"]], jnp.float32), (2000, 1))
    tok, logp, invalid = sampling.sample_logits(jax.random.PRNGKey(0), logits, method)
    counts = np.bincount(np.asarray(tok), minlength=4)
    assert counts[3] == 0 and (counts[:3] > 0).all()
    assert not np.asarray(invalid).any() and np.isfinite(np.asarray(logp)).all()


def test_case_09_single_finite_logit():
    c = CASE_09["single_finite_case"]
    logits = jnp.asarray([c["logits"]], jnp.float32)
    for method in (sampling.TopP(c["top_p"]), sampling.Temperature(1.0), sampling.TopK(2),
                   sampling.Greedy()):
        tok, logp, invalid = sampling.sample_logits(jax.random.PRNGKey(3), logits, method)
        assert int(tok[0]) == c["token"] and not bool(invalid[0])
        assert float(logp[0]) == pytest.approx(0.0, abs=1e-6)
    probs = jax.nn.softmax(sampling.truncated_logits(logits, sampling.TopP(c["top_p"])), axis=-1)
    np.testing.assert_allclose(np.asarray(probs[0]), c["probs"], atol=1e-7)


def test_case_09_all_masked_row_is_flagged_by_sample_logits():
    c = CASE_09["all_masked_case"]
    logits = jnp.asarray([c["logits"], [0.0, 1.0, NEG_INF, NEG_INF]], jnp.float32)
    for method in (sampling.Greedy(), sampling.Temperature(0.7), sampling.TopK(2),
                   sampling.TopP(0.9)):
        tok, logp, invalid = sampling.sample_logits(jax.random.PRNGKey(0), logits, method)
        assert np.asarray(invalid).tolist() == [True, False]
        assert np.isfinite(np.asarray(logp)).all()
        assert int(tok[1]) in (0, 1)


def test_sample_logits_scores_a_constrained_or_forced_token_under_the_unconstrained_logits():
    """One log-softmax a step: the drawn token (from the masked logits) is scored under
    score_logits / T, by hand; a forced row takes its token whatever its mask allows (even
    none: not invalid) and is scored the same way; a row neither forced nor allowed any
    token stays invalid with log-prob 0."""
    full = np.asarray([[0.5, 2.0, -1.0, 1.0], [1.0, 0.0, 3.0, -2.0],
                       [0.0, 1.0, 2.0, 3.0]], np.float32)
    masked = full.copy()
    masked[0, [1, 3]] = NEG_INF          # row 0 may draw token 0 or 2
    masked[1, :] = NEG_INF               # row 1: nothing allowed; forced to stop id 3
    masked[2, :] = NEG_INF               # row 2: nothing allowed, not forced: invalid
    forced = jnp.asarray([-1, 3, -1], jnp.int32)
    for method, t in ((sampling.Greedy(), 1.0), (sampling.Temperature(0.7), 0.7)):
        tok, logp, invalid = sampling.sample_logits(
            jax.random.PRNGKey(3), jnp.asarray(masked), method, score_logits=jnp.asarray(full),
            forced=forced)
        tok = np.asarray(tok)
        assert np.asarray(invalid).tolist() == [False, False, True]
        assert tok[0] in (0, 2) and tok[1] == 3 and tok[2] == 0
        if t == 1.0:
            assert tok[0] == 0  # the masked row's argmax
        z = full / t
        want = z - np.log(np.exp(z).sum(-1, keepdims=True))
        # Float32 log-softmax of 4 logits of magnitude <= 5: a few ulp of 5.
        np.testing.assert_allclose(np.asarray(logp)[:2], [want[0, tok[0]], want[1, 3]],
                                   rtol=0, atol=8 * np.finfo(np.float32).eps * 5)
        assert float(logp[2]) == 0.0


def test_case_09_generate_raises_when_constraint_allows_nothing(tiny_model):
    cfg, params = tiny_model
    prompts = _prompts(np.random.default_rng(0), [4, 6], cfg.vocab_size)
    with pytest.raises(ValueError, match="no allowed token"):
        sampling.generate(params, cfg, prompts, key=jax.random.PRNGKey(0), max_new_tokens=4,
                          stop_ids=[2], constraint=_FakeConstraint(cfg.vocab_size, block=[0, 1]))


def test_case_09_allow_invalid_flags_the_row(tiny_model):
    cfg, params = tiny_model
    prompts = _prompts(np.random.default_rng(0), [4, 6], cfg.vocab_size)
    kw = dict(key=jax.random.PRNGKey(0), max_new_tokens=4, stop_ids=[-7], pad_id=0)
    out = sampling.generate(params, cfg, prompts, **kw, allow_invalid=True,
                            constraint=_FakeConstraint(cfg.vocab_size, block=[1]))
    assert out.invalid.tolist() == [False, True]
    # The blocked row ends with no token at all; the other row is untouched.
    assert out.lengths.tolist() == [4, 0] and not out.mask[1].any()
    assert out.truncated.tolist() == [True, False]
    free = sampling.generate(params, cfg, prompts, **kw)
    np.testing.assert_array_equal(out.tokens[0], free.tokens[0])
    # Same logits; the constrained program may reduce them in another order (tolerances.py).
    np.testing.assert_allclose(out.logprobs[0], free.logprobs[0], rtol=0,
                               atol=logprob_atol(free.logprobs[0], cfg.vocab_size))


# --------------------------------------------------------------------------- methods


def test_method_from_flags():
    assert sampling.method_from_flags(0.0) == sampling.Greedy()
    assert sampling.method_from_flags(0.7) == sampling.Temperature(0.7)
    assert sampling.method_from_flags(0.7, top_k=5) == sampling.TopK(5, 0.7)
    assert sampling.method_from_flags(0.7, top_k=5, top_p=0.9) == sampling.TopP(0.9, 0.7)
    for bad in (dict(temperature=-1.0), dict(temperature=1.0, top_p=0.0),
                dict(temperature=1.0, top_p=1.5), dict(temperature=1.0, top_k=-1)):
        with pytest.raises(ValueError):
            sampling.method_from_flags(**bad)


def test_greedy_equals_temperature_zero(tiny_model):
    cfg, params = tiny_model
    prompts = _prompts(np.random.default_rng(1), [5, 8, 3], cfg.vocab_size)
    outs = [sampling.generate(params, cfg, prompts, key=jax.random.PRNGKey(seed),
                              max_new_tokens=6, method=m, stop_ids=[2])
            for seed, m in ((0, sampling.Greedy()), (1, sampling.method_from_flags(0.0)),
                            (2, sampling.Temperature(0.0)))]
    for o in outs[1:]:
        np.testing.assert_array_equal(o.tokens, outs[0].tokens)
        np.testing.assert_array_equal(o.logprobs, outs[0].logprobs)


def test_top_k_only_draws_the_k_largest():
    logits = jax.random.normal(jax.random.PRNGKey(0), (4, 50))
    tok, _, _ = sampling.sample_logits(
        jax.random.PRNGKey(1), jnp.repeat(logits, 200, axis=0), sampling.TopK(3, 2.0))
    top3 = np.argsort(-np.asarray(logits), axis=-1)[:, :3]
    for r in range(4):
        assert set(np.asarray(tok[r * 200:(r + 1) * 200]).tolist()) <= set(top3[r].tolist())


# --------------------------------------------------------------------------- stop handling


def test_counting_model_counts(counting):
    cfg, params = counting
    out = sampling.generate(params, cfg, [[5, 9], [40]], key=jax.random.PRNGKey(0),
                            max_new_tokens=5, stop_ids=[0])
    assert out.tokens.tolist() == [[10, 11, 12, 13, 14], [41, 42, 43, 44, 45]]
    np.testing.assert_allclose(out.logprobs, 0.0, atol=1e-6)


def test_mask_includes_stop_token_and_excludes_the_rest(counting):
    cfg, params = counting
    out = sampling.generate(params, cfg, [[5], [20], [30]], key=jax.random.PRNGKey(0),
                            max_new_tokens=10, stop_ids=[9, 33], pad_id=0)
    # Row 0: 6 7 8 9(stop); row 1: never stops (21..30); row 2: 31 32 33(stop).
    assert out.tokens[0].tolist() == [6, 7, 8, 9] + [0] * 6
    assert out.mask[0].tolist() == [True] * 4 + [False] * 6
    assert out.tokens[2].tolist() == [31, 32, 33] + [0] * 7
    assert out.mask[2].tolist() == [True] * 3 + [False] * 7
    assert out.tokens[1].tolist() == list(range(21, 31)) and out.mask[1].all()
    assert out.lengths.tolist() == [4, 10, 3]
    assert out.lengths.tolist() == out.mask.sum(-1).tolist()
    assert out.truncated.tolist() == [False, True, False]
    assert not out.invalid.any()


def test_pad_equal_to_eos_is_told_apart_by_the_mask(counting):
    """pad == eos == 9: filler after the stop is also 9, and a 9 inside the prompt is a
    real token. Lengths come from the mask, not from comparing ids with the pad id."""
    cfg, params = counting
    eos = 9
    out = sampling.generate(params, cfg, [[3, eos, 5], [eos, 7]], key=jax.random.PRNGKey(0),
                            max_new_tokens=6, stop_ids=[eos], pad_id=eos)
    assert out.tokens.tolist() == [[6, 7, 8, 9, 9, 9], [8, 9, 9, 9, 9, 9]]
    assert out.mask.tolist() == [[True] * 4 + [False] * 2, [True] * 2 + [False] * 4]
    assert out.lengths.tolist() == [4, 2]
    assert (out.tokens != eos).sum(-1).tolist() != out.lengths.tolist()
    # A prompt with the pad id inside gives the same result alone and left-padded in a batch.
    alone = sampling.generate(params, cfg, [[eos, 7]], key=jax.random.PRNGKey(0),
                              max_new_tokens=6, stop_ids=[eos], pad_id=eos)
    np.testing.assert_array_equal(alone.tokens[0], out.tokens[1])


def test_loop_exits_when_every_row_stopped(counting):
    cfg, params = counting
    tokens, mask = sampling.left_pad([[5], [1, 2]], 16, 0)
    state = sampling.prefill(params, cfg, jnp.asarray(tokens), jnp.asarray(mask),
                             jax.random.PRNGKey(0), 32)
    state = sampling.decode_loop(params, cfg, state, sampling.Greedy(),
                                 jnp.asarray([8, 4], jnp.int32), 0)
    # Row 0 stops at 8 (3 tokens), row 1 at 4 (2 tokens): 3 steps of 32 run.
    assert int(state.step) == 3
    assert np.asarray(state.done).all()
    assert np.asarray(state.mask).sum(-1).tolist() == [3, 2]


def test_generate_rejects_bad_arguments(tiny_model):
    cfg, params = tiny_model
    kw = dict(key=jax.random.PRNGKey(0), max_new_tokens=2)
    with pytest.raises(ValueError, match="stop_ids"):
        sampling.generate(params, cfg, [[5]], stop_ids=[], **kw)
    with pytest.raises(ValueError, match="no prompts"):
        sampling.generate(params, cfg, [], stop_ids=[2], **kw)
    with pytest.raises(ValueError, match="tokens"):
        sampling.generate(params, cfg, [[5], []], stop_ids=[2], **kw)
    with pytest.raises(ValueError, match="row_ids"):
        sampling.generate(params, cfg, [[5], [6]], stop_ids=[2], row_ids=[0], **kw)
    with pytest.raises(ValueError, match="row_ids"):
        sampling.generate(params, cfg, [[5], [6]], stop_ids=[2], row_ids=[0, -1], **kw)


def test_bucket_length_and_left_pad():
    assert [sampling.bucket_length(n) for n in (1, 5, 16, 17, 33, 128, 129)] == [
        16, 16, 16, 32, 64, 128, 256]
    assert sampling.bucket_length(3, minimum=4) == 4
    # Above 512 tokens: multiples of 128 (690 -> 768, not 1024), configurable.
    assert [sampling.bucket_length(n) for n in (511, 512, 513, 690, 1024, 1025)] == [
        512, 512, 640, 768, 1024, 1152]
    assert sampling.bucket_length(690, step=256, pow2_until=256) == 768
    tokens, mask = sampling.left_pad([[7, 8], [9]], 4, 2)
    assert tokens.tolist() == [[2, 2, 7, 8], [2, 2, 2, 9]]
    assert mask.tolist() == [[False, False, True, True], [False, False, False, True]]
    with pytest.raises(ValueError):
        sampling.left_pad([[1, 2, 3]], 2, 0)


# --------------------------------------------------------------------------- keys, batching


def test_same_key_same_tokens_other_key_other_tokens(tiny_model):
    cfg, params = tiny_model
    prompts = _prompts(np.random.default_rng(2), [6, 4], cfg.vocab_size)
    kw = dict(max_new_tokens=8, method=sampling.Temperature(1.0), stop_ids=[2])
    a = sampling.generate(params, cfg, prompts, key=jax.random.PRNGKey(7), **kw)
    b = sampling.generate(params, cfg, prompts, key=jax.random.PRNGKey(7), **kw)
    c = sampling.generate(params, cfg, prompts, key=jax.random.PRNGKey(8), **kw)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
    assert (a.tokens != c.tokens).any(axis=-1).all()


@pytest.mark.slow
def test_greedy_output_independent_of_batchmates_and_bucket(tiny_model):
    cfg, params = tiny_model
    rng = np.random.default_rng(3)
    (prompt,) = _prompts(rng, [5], cfg.vocab_size, insert_id=2)  # pad id inside the prompt
    others = _prompts(rng, [9, 20, 2], cfg.vocab_size, insert_id=2)
    kw = dict(key=jax.random.PRNGKey(0), max_new_tokens=8, stop_ids=[2])
    alone = sampling.generate(params, cfg, [prompt], **kw)
    for batch, min_bucket in (([prompt, others[0]], 16), ([others[1], prompt, others[2]], 16),
                              ([prompt], 64)):
        out = sampling.generate(params, cfg, batch, min_bucket=min_bucket, **kw)
        row = batch.index(prompt)
        np.testing.assert_array_equal(out.tokens[row], alone.tokens[0])
        np.testing.assert_array_equal(out.mask[row], alone.mask[0])
        # Other batch shapes sum the O(1) logits in another order (ulps of 1, far below the
        # log-softmax rounding of these |log p| ~ 11 that `logprob_atol` allows for).
        np.testing.assert_allclose(out.logprobs[row], alone.logprobs[0], rtol=0,
                                   atol=logprob_atol(alone.logprobs[0], cfg.vocab_size))


def test_prompt_lengths_in_one_bucket_compile_once(tiny_model):
    cfg, params = tiny_model
    rng = np.random.default_rng(4)
    kw = dict(key=jax.random.PRNGKey(0), max_new_tokens=3, stop_ids=[2])  # N=3: this test only
    n_pre, n_dec = sampling.prefill._cache_size(), sampling.decode_loop._cache_size()
    for n in (5, 9, 16):  # all in bucket 16
        sampling.generate(params, cfg, _prompts(rng, [n], cfg.vocab_size), **kw)
    assert sampling.prefill._cache_size() - n_pre == 1
    assert sampling.decode_loop._cache_size() - n_dec == 1
    sampling.generate(params, cfg, _prompts(rng, [17], cfg.vocab_size), **kw)  # bucket 32
    assert sampling.prefill._cache_size() - n_pre == 2


@pytest.mark.parametrize("method", [sampling.Temperature(0.7), sampling.Greedy(),
                                    sampling.TopP(0.8, 1.3)], ids=["T0.7", "greedy", "topp"])
def test_logprobs_equal_full_forward(tiny_model, method):
    """Per-token log-probs from the cached sampler equal log softmax(logits / T) of one full
    forward pass over prompt + generated tokens (what the GRPO ratio recomputes)."""
    cfg, params = tiny_model
    prompts = _prompts(np.random.default_rng(5), [7, 3, 12], cfg.vocab_size, insert_id=2)
    out = sampling.generate(params, cfg, prompts, key=jax.random.PRNGKey(1), max_new_tokens=10,
                            method=method, stop_ids=[2])
    temp = sampling.scoring_temperature(method)
    want = _recomputed_logprobs(params, cfg, prompts, out, temp)
    # The cached and the full forward sum in other orders: one float32 evaluation each.
    np.testing.assert_allclose(out.logprobs, want, atol=logprob_atol(want, cfg.vocab_size),
                               rtol=0)
    assert (out.logprobs[~out.mask] == 0).all()


# --------------------------------------------------------------------------- JSON constraint


def _check_rubric_doc(doc, max_items, max_chars):
    """Validates `doc` against text.rubric_format's schema with jsonschema (the test extra)."""
    import jsonschema

    jsonschema.validate(doc, RUBRIC_JSON_SCHEMA(max_items, max_chars))


@pytest.mark.slow
def test_json_constrained_samples_always_parse(tiny_model, smollm2_tokenizer):
    """100 samples at temperature 1 from a random-weight model: every one is a complete
    document of the schema, and its log-probs are the unconstrained model's."""
    from drubric_jax.sampling.constrained import JsonSchemaConstraint

    cfg, params = tiny_model
    tok = smollm2_tokenizer
    max_items, max_chars = 3, 40
    schema = RUBRIC_JSON_SCHEMA(max_items, max_chars)
    # Token bound: every token is >= 1 byte; a string character is at most 6 bytes of JSON
    # (\uXXXX escape) and the grammar allows no whitespace, so a document has at most
    # len('{"rubrics":[') + items * (len('{"rubric":"') + 6 * chars + len('","weight":5}'))
    # + (items - 1) commas + len(']}') bytes; one more step for the stop token.
    bound = 12 + max_items * (11 + 6 * max_chars + 12) + (max_items - 1) + 2 + 1
    constraint = JsonSchemaConstraint(tok, schema, cfg.vocab_size, tok.eos_token_id)
    prompt = tok_lib.chat_ids(tok, [{"role": "user", "content": "Write a rubric as JSON."}])
    n_ok = 0
    for seed in range(4):
        out = sampling.generate(params, cfg, [prompt] * 25, key=jax.random.PRNGKey(seed),
                                max_new_tokens=bound, method=sampling.Temperature(1.0),
                                stop_ids=tok_lib.stop_ids(tok), constraint=constraint)
        assert not out.truncated.any() and not out.invalid.any()
        assert constraint.errors() == [""] * 25
        for b in range(25):
            ids = out.tokens[b][out.mask[b]].tolist()
            assert ids[-1] == tok.eos_token_id
            doc = json.loads(tok.decode(ids[:-1], skip_special_tokens=False))
            _check_rubric_doc(doc, max_items, max_chars)
            n_ok += 1
        if seed == 0:
            rows = [0, 1, 2]
            want = _recomputed_logprobs(params, cfg, [prompt] * 3, _take_rows(out, rows), 1.0)
            np.testing.assert_allclose(out.logprobs[rows], want,
                                       atol=logprob_atol(want, cfg.vocab_size), rtol=0)
    assert n_ok == 100


def _take_rows(out, rows):
    return out.take(rows)


# --------------------------------------------------------------------------- real model


@pytest.mark.real_model
@pytest.mark.slow
def test_real_model_greedy_capital_of_france(smollm2):
    cfg, params, tok = smollm2
    ids = tok_lib.chat_ids(tok, [{"role": "user", "content": "What is the capital of France?"}])
    out = sampling.generate(params, cfg, [ids], key=jax.random.PRNGKey(0), max_new_tokens=24,
                            stop_ids=tok_lib.stop_ids(tok))
    text = tok.decode(out.tokens[0][out.mask[0]], skip_special_tokens=True)
    assert "Paris" in text, text
    assert math.isfinite(float(out.logprobs[0][out.mask[0]].sum()))


@pytest.mark.real_model
@pytest.mark.slow
def test_sample_entrypoint_prints_paris(smollm2):
    env = dict(os.environ, XLA_FLAGS="", TRANSFORMERS_NO_ADVISORY_WARNINGS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.sample", "--prompt",
         "What is the capital of France?", "--max_new_tokens", "24"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Paris" in proc.stdout, proc.stdout


@pytest.mark.real_model
@pytest.mark.slow
def test_bench_sampler_prints_one_json_row_per_batch(smollm2, tmp_path):
    env = dict(os.environ, XLA_FLAGS="", TRANSFORMERS_NO_ADVISORY_WARNINGS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.bench_sampler", "--batches=1,2", "--prompt_len=16",
         "--new_tokens=4", "--reps=1", "--matmul_n=128", "--impl=all", "--profile",
         f"--compile_cache_dir={tmp_path / 'xla'}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    ours = [r for r in rows if r["impl"] == "jax"]
    assert [r["batch"] for r in ours] == [1, 2]
    for r in ours:
        assert {"prompt_len", "new_tokens", "prefill_tok_s", "decode_tok_s", "peak_rss_mb",
                "compile_s", "prefill_mfu", "decode_bytes_per_step"} <= r.keys()
        assert r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0
        # Every float32 parameter (~134.5M, 538 MB) plus the cache's 20 slots.
        assert r["decode_bytes_per_step"] > 4 * 134_000_000
        assert r["decode_roofline_frac"] > 0 and r["decode_mfu"] > 0
        # --profile: the traced calls' time by kind of operation (experiments/op_profile.py).
        for ops in (r["prefill_ops"], r["decode_ops"]):
            assert tuple(ops["ms"]) == op_profile.KINDS and ops["wall_ms"] > 0
            assert ops["ms"]["weight_matmul"] > 0 and ops["ms"]["attention"] > 0
            assert 0 < len(ops["top"]) <= 5 and all(op[1] in op_profile.KINDS
                                                     for op in ops["top"])
        assert r["decode_ops"]["ms"]["lm_head"] > 0  # every step's logits
    bandwidth = [r for r in rows if r["impl"] == "bandwidth"]
    assert len(bandwidth) == 1 and bandwidth[0]["read_gb_s"] > 0
    assert sorted(bandwidth[0]["matmul_stream_gb_s"]) == ["1", "2"]  # JSON keys are strings
    assert any(r["impl"] == "matmul" and r["float32_gflop_s"] > 0 for r in rows)
    assert any(r["impl"] == "transformers" for r in rows)  # measured, or why it was skipped


@pytest.mark.parametrize("shape", [(2, 2, 2), (1, 8, 1)])
@pytest.mark.parametrize("method", [sampling.Greedy(), sampling.Temperature(0.8)])
def test_sampler_on_a_mesh_gives_the_one_device_tokens(tiny_model, shape, method):
    """Rows over (data, fsdp) (5 rows: padded to the mesh, filler dropped), KV heads over
    tensor, params sharded: the same key gives the 1-device tokens and masks, and
    log-probs within the float32 rounding of a log-softmax (`logprob_atol`)."""
    from drubric_jax import parallel

    from drubric_jax.models.rollout import rollout_copy

    cfg, params = tiny_model
    mesh = parallel.make_mesh(*shape)
    sharded = jax.device_put(params, models.param_shardings(params, mesh))
    prompts = [[5, 9, 12], [40], [7, 7, 7, 7, 7, 8], [100, 200], [3000, 11]]
    kw = dict(key=jax.random.PRNGKey(4), max_new_tokens=6, method=method, stop_ids=[2])
    one = sampling.generate(params, cfg, prompts, **kw)
    # The training layout, and the rollout copy (decode layout: no fsdp split) of it.
    rollout = rollout_copy(sharded, cfg, mesh)
    assert all(len(x.sharding.device_set) == 8 for x in jax.tree.leaves(rollout))
    for p in (sharded, rollout):
        many = sampling.generate(p, cfg, prompts, mesh=mesh, **kw)
        assert many.num_rows == 5
        np.testing.assert_array_equal(many.tokens, one.tokens)
        np.testing.assert_array_equal(many.mask, one.mask)
        np.testing.assert_allclose(many.logprobs, one.logprobs, rtol=0,
                                   atol=logprob_atol(one.logprobs, cfg.vocab_size))


def test_rollout_copy_is_the_decode_layout_and_a_no_op_where_it_already_is(tiny_model):
    """`rollout_copy`: fsdp-split leaves come back replicated over fsdp (tensor splits
    kept), matrices in the compute dtype, norms as stored; in the stacked form, or in the
    per-layer form decode loops run on (CPU and GPU: one copy, `sampling.decode_params`
    then copies nothing); on one device, or with no fsdp axis and the compute dtype
    already, the params themselves come back."""
    from drubric_jax import parallel
    from drubric_jax.models.rollout import rollout_copy

    cfg, params = tiny_model
    mesh = parallel.make_mesh(1, 4, 2)
    sharded = jax.device_put(params, models.param_shardings(params, mesh))
    bf16 = cfg.replace(dtype="bfloat16")
    stacked = rollout_copy(sharded, bf16, mesh, per_layer=False)
    per_layer = rollout_copy(sharded, bf16, mesh, per_layer=True)
    assert isinstance(per_layer["layers"], tuple) and len(per_layer["layers"]) == cfg.num_layers
    assert sampling.decode_params(per_layer, bf16) is per_layer  # no second copy
    for i, layer in enumerate(per_layer["layers"]):
        wq = layer["wq"]
        assert "fsdp" not in jax.tree.leaves(tuple(wq.sharding.spec))
        assert tuple(wq.sharding.spec) == tuple(stacked["layers"]["wq"].sharding.spec)[1:]
        assert wq.dtype == jnp.bfloat16 and layer["attn_norm"].dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(wq), np.asarray(stacked["layers"]["wq"][i]))
    wq = stacked["layers"]["wq"]
    assert "fsdp" not in jax.tree.leaves(tuple(wq.sharding.spec))
    assert "tensor" in jax.tree.leaves(tuple(wq.sharding.spec))
    assert wq.dtype == jnp.bfloat16 and stacked["layers"]["attn_norm"].dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(wq, np.float32),
                                  np.asarray(params["layers"]["wq"].astype(jnp.bfloat16),
                                             np.float32))
    # Sampling on either form gives the same tokens (the prefill runs a layer loop on the
    # per-layer weights, over the stacked cache).
    kw = dict(key=jax.random.PRNGKey(2), max_new_tokens=4, stop_ids=[2], mesh=mesh)
    prompts = [[5, 9, 12], [40], [7] * 20, [100, 200]]
    a = sampling.generate(stacked, bf16, prompts, **kw)
    b = sampling.generate(per_layer, bf16, prompts, **kw)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    # The form is the config's (`ModelConfig.decode_form`), not a global: "stacked" decodes
    # the stacked arrays (no per-layer copy is made), with the same tokens.
    as_tpu = bf16.replace(decode_form="stacked")
    assert sampling.decode_params(stacked, as_tpu) is stacked
    np.testing.assert_array_equal(sampling.generate(stacked, as_tpu, prompts, **kw).tokens,
                                  a.tokens)
    with pytest.raises(ValueError, match="decode_form"):
        bf16.replace(decode_form="layers")
    assert rollout_copy(params, cfg, parallel.make_mesh(1, 1, 1, jax.devices()[:1])) is params
    tp = parallel.make_mesh(4, 1, 2)
    on_tp = jax.device_put(params, models.param_shardings(params, tp))
    assert rollout_copy(on_tp, cfg, tp) is on_tp


def test_generate_chunked_shares_the_bucket_and_joins_the_rows(tiny_model, monkeypatch):
    """Rollout micro-batches: one call is `generate` itself; several calls share the prompt
    bucket of the longest prompt, so their rows join, each call keyed fold_in(key, i); the
    short last call is padded to the others' rows (copies of its last prompt, dropped), so
    all calls run one compiled program; the decode loops' per-layer weight copy (CPU) is
    made once for all the calls."""
    from drubric_jax.sampling import decode as decode_module

    copies = []
    layer_copy = decode_module.layer_copy
    monkeypatch.setattr(decode_module, "layer_copy",
                        lambda *a: copies.append(1) or layer_copy(*a))
    cfg, params = tiny_model
    prompts = [[5, 9, 12], [40], [7] * 20, [100, 200], [3000, 11]]
    kw = dict(key=jax.random.PRNGKey(4), max_new_tokens=5, method=sampling.Temperature(1.0),
              stop_ids=[2])
    whole = sampling.generate(params, cfg, prompts, **kw)
    one = sampling.generate_chunked(params, cfg, prompts, 0, **kw)
    np.testing.assert_array_equal(one.tokens, whole.tokens)
    calls = []
    n_dec = sampling.decode_loop._cache_size()
    copies.clear()
    parts = sampling.generate_chunked(params, cfg, prompts, 2, after_call=calls.append, **kw)
    assert len(copies) == 1  # three calls, one weight copy
    assert sampling.decode_loop._cache_size() - n_dec == 1  # 2 + 2 + 1 rows: one program
    assert calls == [2, 2, 1] and parts.num_rows == 5  # each call's prompts, filler left out
    assert parts.prompt_tokens.shape == whole.prompt_tokens.shape  # one bucket for all
    np.testing.assert_array_equal(parts.prompt_tokens, whole.prompt_tokens)
    third = sampling.generate(params, cfg, prompts[4:] * 2,
                              min_bucket=whole.prompt_tokens.shape[1],
                              **dict(kw, key=jax.random.fold_in(kw["key"], 2)))
    np.testing.assert_array_equal(parts.tokens[4:], third.tokens[:1])
    padded = sampling.generate(params, cfg, prompts[4:], pad_rows=2,
                               min_bucket=whole.prompt_tokens.shape[1],
                               **dict(kw, key=jax.random.fold_in(kw["key"], 2)))
    assert padded.num_rows == 1
    np.testing.assert_array_equal(padded.tokens, third.tokens[:1])


@pytest.mark.parametrize("shape", [None, (2, 2, 2)])
def test_per_row_draws_do_not_depend_on_the_calls_layout(tiny_model, shape):
    """row_ids: a row's tokens depend on (key, its id, its prompt) only, not on the
    micro-batch, the rows beside it, the mesh's filler rows or its position in the call;
    distinct ids draw distinct numbers (two copies of a prompt differ)."""
    from drubric_jax import parallel

    cfg, params = tiny_model
    mesh = None if shape is None else parallel.make_mesh(*shape)
    if mesh is not None:
        params = jax.device_put(params, models.param_shardings(params, mesh))
    prompts = [[5, 9, 12], [40], [7] * 20, [100, 200], [3000, 11], [5, 9, 12]]
    kw = dict(key=jax.random.PRNGKey(4), max_new_tokens=6, method=sampling.Temperature(1.0),
              stop_ids=[2], mesh=mesh)
    ids = [10, 11, 12, 13, 14, 15]
    whole = sampling.generate_chunked(params, cfg, prompts, 0, row_ids=ids, **kw)
    for per_call in (1, 2, 4):
        parts = sampling.generate_chunked(params, cfg, prompts, per_call, row_ids=ids, **kw)
        np.testing.assert_array_equal(parts.tokens, whole.tokens)
    # A sub-batch in another order (and another bucket) draws the same rows.
    sub = sampling.generate(params, cfg, [prompts[4], prompts[1]], row_ids=[14, 11], **kw)
    np.testing.assert_array_equal(sub.tokens, whole.tokens[[4, 1]])
    assert (whole.tokens[0] != whole.tokens[5]).any()  # same prompt, other id


# --------------------------------------------------------------------------- cache segments


def test_cache_schedule_doubles_each_segment():
    """Segment j of m ends after ceil(N / 2^(m-1-j)) new tokens (multiples of 128 when the
    first segment has 128); "auto" (0) splits in 4 only for long generations (N >= 4096
    and N >= P / 2) on per-layer caches; equal ends merge."""
    assert sampling.cache_schedule(1024, 8192, 0) == (2048, 3072, 5120, 9216)
    # A step reads P + N (1/8 * 1/8 + 1/4 * 1/8 + 1/2 * 1/4 + 1/2) slots on average.
    assert sampling.mean_slots_read((2048, 3072, 5120, 9216), 1024, 8192) == 1024 + 0.671875 * 8192
    assert sampling.cache_schedule(1024, 8192, 1) == (9216,)
    assert sampling.mean_slots_read((9216,), 1024, 8192) == 9216
    assert sampling.cache_schedule(1024, 8192, 0, per_layer=False) == (9216,)  # TPU: stacked
    assert sampling.cache_schedule(8192, 8192, 0) == (9216, 10240, 12288, 16384)
    assert sampling.cache_schedule(24576, 8192, 0) == (32768,)    # N < P / 2
    assert sampling.cache_schedule(128, 2048, 0) == (2176,)       # N < 4096
    assert sampling.cache_schedule(16, 300, 3) == (91, 166, 316)  # no alignment: 75 < 128
    assert sampling.cache_schedule(16, 2, 4) == (17, 18)          # ends 1, 1, 1, 2 merged
    with pytest.raises(ValueError, match="cache_segments"):
        sampling.cache_schedule(16, 8, -1)


def test_add_chunk_keeps_the_slots_and_appends_empty_ones(tiny_model):
    """Per-layer caches get a chunk per layer (the written slots are the same arrays);
    stacked ones are padded; either way the old slots read back and the new ones are
    empty and invalid."""
    cfg, params = tiny_model
    cache = models.init_cache(cfg, 2, 5)
    k = jax.random.normal(jax.random.PRNGKey(0), cache.k.shape).astype(cache.k.dtype)
    cache = cache.replace(k=k, v=2 * k, valid=jnp.ones((2, 5), bool).at[0, 0].set(False),
                          index=jnp.int32(5), empty=False)
    layers = models.unstack_cache(cache)
    chunked = models.add_chunk(models.add_chunk(layers, 8), 11)
    assert [c.shape[2] for c in chunked.k[0]] == [5, 3, 3]
    assert chunked.k[0][0] is layers.k[0]  # not copied
    for form in (models.add_chunk(cache, 11), chunked):
        grown = models.stack_cache(form)
        assert grown.num_slots == form.num_slots == 11
        assert int(grown.index) == 5 and not grown.empty
        np.testing.assert_array_equal(grown.k[..., :5, :], k)
        np.testing.assert_array_equal(grown.v[..., :5, :], 2 * k)
        assert not np.asarray(grown.k[..., 5:, :]).any()
        np.testing.assert_array_equal(grown.valid[:, :5], cache.valid)
        assert not np.asarray(grown.valid[:, 5:]).any()
    with pytest.raises(ValueError, match="shrink"):
        models.add_chunk(cache, 4)
    with pytest.raises(ValueError, match="num_slots"):
        sampling.prefill(params, cfg, jnp.zeros((1, 4), jnp.int32),
                         jnp.ones((1, 4), bool), jax.random.PRNGKey(0), 3, num_slots=4)


@pytest.mark.parametrize("method", [sampling.Greedy(), sampling.Temperature(1.0)],
                         ids=["greedy", "T1"])
def test_cache_segments_give_the_one_segment_tokens(tiny_model, method):
    """`decode_segments` (3 and 7 growing caches) samples the tokens of one cache of P + N
    slots, rows that stop early included. Log-probs: the segments read the same keys over
    fewer masked slots (exact zeros in the softmax), so only the summation order differs:
    the tolerance of two evaluations of the same logits (tolerances.logprob_atol)."""
    cfg, params = tiny_model
    prompts = _prompts(np.random.default_rng(3), [5, 11, 3, 16], cfg.vocab_size)
    kw = dict(key=jax.random.PRNGKey(1), max_new_tokens=40, method=method)
    free = sampling.generate(params, cfg, prompts, cache_segments=1, stop_ids=[-7], **kw)
    # Stop ids that rows 0 and 1 sample on their way (at steps 9 and 25 or earlier).
    kw["stop_ids"] = [int(free.tokens[0, 9]), int(free.tokens[1, 25])]
    one = sampling.generate(params, cfg, prompts, cache_segments=1, **kw)
    assert one.lengths[0] <= 10 and one.lengths[1] <= 26  # rows that stop early
    for m in (3, 7):
        assert len(sampling.cache_schedule(16, 40, m)) == m
        seg = sampling.generate(params, cfg, prompts, cache_segments=m, **kw)
        np.testing.assert_array_equal(seg.tokens, one.tokens)
        np.testing.assert_array_equal(seg.mask, one.mask)
        np.testing.assert_allclose(seg.logprobs, one.logprobs, rtol=0,
                                   atol=logprob_atol(one.logprobs, cfg.vocab_size))


class _EvenStepConstraint(_FakeConstraint):
    """Allows at even steps only the lower half of the vocabulary (a constraint that bites),
    everything at odd steps."""

    def reset(self, batch):
        self.batch, self.step = batch, 0

    def fill(self, bitmask, rows):
        a = np.ones((self.batch, self.vocab), bool)
        if self.step % 2 == 0:
            a[:, self.vocab // 2:] = False
        bitmask[rows] = pack_bitmask(a)[rows]

    def advance(self, tokens, live):
        self.step += 1


def test_cache_segments_in_constrained_decoding(tiny_model):
    """The host loop grows the cache between steps (`constrained.decode(cache_slots=)`): the
    tokens of one cache, under a constraint that changes what is allowed every step."""
    cfg, params = tiny_model
    prompts = _prompts(np.random.default_rng(4), [6, 2, 9], cfg.vocab_size)
    kw = dict(key=jax.random.PRNGKey(2), max_new_tokens=24, method=sampling.Temperature(1.0),
              stop_ids=[-7], pad_id=0)
    one = sampling.generate(params, cfg, prompts, constraint=_EvenStepConstraint(cfg.vocab_size),
                            cache_segments=1, **kw)
    assert (one.tokens[:, ::2] < cfg.vocab_size // 2).all()  # the constraint held
    free = sampling.generate(params, cfg, prompts, cache_segments=1, **kw)
    assert (free.tokens != one.tokens).any()  # and bit
    seg = sampling.generate(params, cfg, prompts, constraint=_EvenStepConstraint(cfg.vocab_size),
                            cache_segments=3, **kw)
    np.testing.assert_array_equal(seg.tokens, one.tokens)
    np.testing.assert_allclose(seg.logprobs, one.logprobs, rtol=0,
                               atol=logprob_atol(one.logprobs, cfg.vocab_size))


@pytest.mark.slow  # 10-21 s on 2 cores (make test-fast leaves it out)
def test_cache_segments_on_a_mesh_give_the_one_device_tokens(tiny_model):
    """On a (2, 2, 2) mesh (rows over data x fsdp, KV heads over tensor, the rollout copy)
    the chunks keep the cache's layout: 3 segments, unconstrained and constrained, give
    the one-device tokens of one segment, and the decode-form cache that comes back has
    its chunks laid out as the first (rows and heads split)."""
    from drubric_jax import parallel
    from drubric_jax.models.rollout import rollout_copy

    cfg, params = tiny_model
    mesh = parallel.make_mesh(2, 2, 2)
    rollout = rollout_copy(jax.device_put(params, models.param_shardings(params, mesh)),
                           cfg, mesh)
    prompts = [[5, 9, 12], [40], [7, 7, 7, 7, 7, 8], [100, 200], [3000, 11]]
    kw = dict(key=jax.random.PRNGKey(4), max_new_tokens=20, method=sampling.Temperature(1.0),
              stop_ids=[-7], pad_id=0)
    for constraint in (None, _EvenStepConstraint):
        make = (lambda: None) if constraint is None else (lambda: constraint(cfg.vocab_size))
        one = sampling.generate(params, cfg, prompts, cache_segments=1, constraint=make(), **kw)
        many = sampling.generate(rollout, cfg, prompts, mesh=mesh, cache_segments=3,
                                 constraint=make(), **kw)
        np.testing.assert_array_equal(many.tokens, one.tokens)
        np.testing.assert_allclose(many.logprobs, one.logprobs, rtol=0,
                                   atol=logprob_atol(one.logprobs, cfg.vocab_size))
    # The chunks' layout, read off a segmented call's state.
    tokens, mask = sampling.left_pad(prompts + [prompts[-1]] * 3, 16, 0)
    rows = parallel.batch_sharding(mesh)
    slots = sampling.cache_schedule(16, 20, 3)
    state = sampling.prefill(rollout, cfg, jax.device_put(tokens, rows),
                             jax.device_put(mask, rows), jax.random.PRNGKey(0), 20,
                             mesh=mesh, num_slots=slots[0])
    out = sampling.decode_segments(sampling.decode_params(rollout, cfg), cfg,
                                   state.replace(cache=None), state.cache,
                                   sampling.Greedy(), jnp.asarray([-7]), 0, slots)
    chunks = out.cache.k[0]
    assert [c.shape[2] for c in chunks] == [slots[0], slots[1] - slots[0], slots[2] - slots[1]]
    specs = {c.sharding.spec for c in chunks}
    assert len(specs) == 1 and chunks[0].sharding.shard_shape(chunks[0].shape)[:2] == (
        2, cfg.num_kv_heads // 2), specs
