"""Tests of batched JSON-constrained decoding (`drubric_jax.sampling.constrained`): the on-device
bitmask unpack, tokens equal to the host-mask decoding it replaced, no mask fills for rows
that are done, the host/device schedule of a step, and the benchmark's output.

The decoding tests use the `TINY` preset with random weights (V = 49152, the SmolLM2
tokenizer's size) and the real SmolLM2 tokenizer (`smollm2_tokenizer`, skipped without it).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from drubric_jax import sampling
from drubric_jax.sampling import constrained
from drubric_jax.text import tokenizer as tok_lib
from drubric_jax.text.rubric_format import RUBRIC_JSON_SCHEMA

REPO = Path(__file__).resolve().parents[1]
MAX_ITEMS, MAX_CHARS = 2, 12
# Longest document + stop token: as in test_sampling's bound (<= 6 bytes of JSON per string
# character, >= 1 byte per token, no whitespace).
BOUND = 12 + MAX_ITEMS * (11 + 6 * MAX_CHARS + 12) + (MAX_ITEMS - 1) + 2 + 1


def _numpy_unpack(words, vocab):
    """bool[B, V] by numpy's unpackbits (little-endian words, as llguidance writes them)."""
    bits = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little").astype(bool)
    out = np.zeros((words.shape[0], vocab), bool)
    n = min(vocab, bits.shape[1])
    out[:, :n] = bits[:, :n]
    return out


@pytest.mark.parametrize("vocab", [32, 100, 49152 + 45, 151936])
def test_unpack_bitmask_equals_numpy_unpackbits(vocab):
    rng = np.random.default_rng(vocab)
    words = rng.integers(-2**31, 2**31, (5, constrained.bitmask_words(vocab)), dtype=np.int64)
    words = words.astype(np.int32)
    words[0] = -1  # all bits, the padding of the last word too: still only V columns
    words[1] = 0
    words[2, -1] = np.int32(-2**31)  # the sign bit alone: token 32 W - 1 (past V if V % 32)
    got = jax.jit(constrained.unpack_bitmask, static_argnums=1)(jnp.asarray(words), vocab)
    np.testing.assert_array_equal(np.asarray(got), _numpy_unpack(words, vocab))
    assert np.asarray(got)[0].all() and not np.asarray(got)[1].any()
    # pack_bitmask is the inverse, with the padding bits cleared.
    repacked = constrained.pack_bitmask(np.asarray(got))
    np.testing.assert_array_equal(_numpy_unpack(repacked, vocab), np.asarray(got))
    assert not np.unpackbits(repacked.view(np.uint8), axis=-1, bitorder="little")[:, vocab:].any()


def test_unpack_bitmask_narrower_than_the_logits_allows_nothing_past_it():
    words = np.full((2, 3), -1, np.int32)  # 96 tokens
    got = np.asarray(constrained.unpack_bitmask(jnp.asarray(words), 100))
    assert got[:, :96].all() and not got[:, 96:].any()


@pytest.fixture(scope="module")
def schema_constraint(smollm2_tokenizer, tiny_model):
    cfg, _ = tiny_model
    tok = smollm2_tokenizer
    return constrained.JsonSchemaConstraint(tok, RUBRIC_JSON_SCHEMA(MAX_ITEMS, MAX_CHARS),
                                            cfg.vocab_size, tok.eos_token_id)


def test_masks_never_allow_ids_past_the_tokenizer(smollm2_tokenizer):
    """With V larger than the tokenizer and not a multiple of 32, llguidance's masks leave the
    extra ids and the last word's padding bits unset (the unpack relies on neither)."""
    tok = smollm2_tokenizer
    vocab = len(tok) + 45
    c = constrained.JsonSchemaConstraint(tok, RUBRIC_JSON_SCHEMA(MAX_ITEMS, MAX_CHARS), vocab,
                                         tok.eos_token_id)
    c.reset(2)
    first = tok.encode('{"rubrics":', add_special_tokens=False)[0]
    c.advance(np.array([first, first]), np.ones(2, bool))  # a state inside the document
    words = np.full((2, constrained.bitmask_words(vocab)), -1, np.int32)
    c.fill(words, np.ones(2, bool))
    bits = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")
    assert bits[:, :len(tok)].any(axis=1).all()
    assert not bits[:, len(tok):].any()
    assert c.fills.tolist() == [1, 1]


def _host_mask_decode(params, cfg, prompts, key, method, c, stop_ids):
    """The decoding that bitmasks replaced: every row's mask filled one by one each step,
    unpacked to bool[B, V] on the host and sent, then sample and forward in one call.
    Returns (tokens, mask, logprobs) of the generated steps, and the fills per row."""
    import llguidance.numpy as lln

    b, n, pad = len(prompts), BOUND, int(stop_ids[0])
    tokens, mask = sampling.left_pad(prompts, sampling.bucket_length(max(map(len, prompts))),
                                     pad)
    state = sampling.prefill(params, cfg, jnp.asarray(tokens), jnp.asarray(mask), key, n)
    step_fn = jax.jit(lambda p, s, allowed, force: sampling.forward_token(
        p, cfg, *sampling.sample_token(s, method, jnp.asarray(stop_ids), pad, allowed, force)))
    c.reset(b)
    bitmask = lln.allocate_token_bitmask(b, cfg.vocab_size)
    for step in range(n):
        for i, m in enumerate(c.matchers):
            lln.fill_next_token_bitmask(m, bitmask, i)
        c.fills += 1
        allowed = np.unpackbits(bitmask.view(np.uint8), axis=-1, bitorder="little")
        state = step_fn(params, state, allowed[:, :cfg.vocab_size].astype(bool), c.finished())
        tok, emitted, done = jax.device_get(
            (state.tokens[:, step], state.mask[:, step], state.done))
        for i, m in enumerate(c.matchers):
            if emitted[i] and not m.is_stopped():
                m.consume_token(int(tok[i]))
        if done.all():
            break
    out = jax.device_get((state.tokens, state.mask, state.logprobs))
    return out, c.fills.copy()


@pytest.mark.slow  # 10-21 s on 2 cores (make test-fast leaves it out)
def test_same_key_same_tokens_as_host_masks_and_done_rows_get_no_fills(
        tiny_model, smollm2_tokenizer, schema_constraint):
    """Bitmasks unpacked on the device, filled in parallel, overlapped with the forward and
    skipped for finished rows give the host-mask decoding's tokens for the same key; a row
    is filled once per token before its last (its stop token is forced: the grammar had
    stopped), where the host-mask decoding filled every row until the whole batch ended."""
    cfg, params = tiny_model
    tok, c = smollm2_tokenizer, schema_constraint
    stop_ids = tok_lib.stop_ids(tok)
    prompt = tok_lib.chat_ids(tok, [{"role": "user", "content": "Write a rubric as JSON."}])
    prompts = [prompt] * 8
    for method in (sampling.Temperature(1.0), sampling.TopP(0.9, 0.8)):
        key = jax.random.PRNGKey(3)
        (want_tok, want_mask, want_logp), old_fills = _host_mask_decode(
            params, cfg, prompts, key, method, c, stop_ids)
        out = sampling.generate(params, cfg, prompts, key=key, max_new_tokens=BOUND,
                                method=method, stop_ids=stop_ids, constraint=c)
        np.testing.assert_array_equal(out.mask, want_mask)
        np.testing.assert_array_equal(out.tokens[out.mask], want_tok[want_mask])
        # Same ops, other jit boundaries: allow a few float32 ulps of |log p| <~ 20.
        np.testing.assert_allclose(out.logprobs, want_logp, atol=2e-5, rtol=0)
        assert not out.truncated.any() and c.errors() == [""] * len(prompts)
        for b in range(len(prompts)):
            ids = out.tokens[b][out.mask[b]].tolist()
            assert ids[-1] == tok.eos_token_id
            json.loads(tok.decode(ids[:-1]))
        assert len(set(out.lengths.tolist())) > 1, "rows should end at different steps"
        np.testing.assert_array_equal(c.fills, out.lengths - 1)
        assert (old_fills == out.lengths.max()).all()
        assert c.fills.sum() < old_fills.sum()


class _Recorder:
    """All-allowed constraint that logs its calls into a shared event list."""

    def __init__(self, vocab, events):
        self.vocab, self.events = vocab, events

    def reset(self, batch):
        self.batch = batch

    def fill(self, bitmask, rows):
        self.events.append("fill")
        bitmask[rows] = constrained.pack_bitmask(np.ones((self.batch, self.vocab), bool))[rows]

    def finished(self):
        return np.zeros(self.batch, bool)

    def advance(self, tokens, live):
        self.events.append("advance")


def test_mask_fill_of_step_t_plus_1_runs_after_dispatching_the_forward_of_step_t(
        tiny_model, monkeypatch):
    """Per step: sample, forward dispatched, then the host waits for the tokens only and
    fills the next mask while the forward runs. The last step runs no forward and fills no
    mask, but its tokens are consumed (a value completed by the N-th token is `finished`)."""
    cfg, params = tiny_model
    events = []

    def logged(name, fn):
        def call(*args, **kwargs):
            events.append(name)
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(constrained, "_sample", logged("sample", constrained._sample))
    monkeypatch.setattr(constrained, "_forward", logged("forward", constrained._forward))
    monkeypatch.setattr(jax, "device_get", logged("get", jax.device_get))
    sampling.generate(params, cfg, [[5, 6, 7], [8, 9]], key=jax.random.PRNGKey(0),
                      max_new_tokens=3, stop_ids=[-1], pad_id=0,
                      constraint=_Recorder(cfg.vocab_size, events))
    step = ["sample", "forward", "get", "advance", "fill"]
    assert events == ["fill"] + 2 * step + ["sample", "get", "advance", "get"]  # _finish's


def test_bench_constrained_prints_one_row_per_batch(smollm2_tokenizer):
    env = dict(os.environ, XLA_FLAGS="", TRANSFORMERS_NO_ADVISORY_WARNINGS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.bench_constrained", "--batches=2,3",
         "--vocabs=49152", "--host_reps=1", "--reps=1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    rows = [r for r in rows if "batch" in r]
    assert [r["batch"] for r in rows] == [2, 3]
    for r in rows:
        assert r["before_ms_per_token"] > 0 and r["after_ms_per_token"] > 0
        assert r["after_fills"] < r["before_fills"]
        assert {"device_apply_bool_ms", "device_apply_bitmask_ms", "device_unpack_ms"} <= r.keys()
