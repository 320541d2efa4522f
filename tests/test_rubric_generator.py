"""Tests of the rubric generator (drubric_jax/evaluator/rubric_generator.py): constrained
JSON, padded arrays, GRPO tensors, static variant, shuffled labels (drawn in one batched call
per response count) and the input budget (METHOD 2, 6, 8, 11)."""
import json

import jax
import numpy as np
import pytest
from with_params import WithParams

from drubric_jax.text import prompts
from drubric_jax.text.budget import TRUNCATION_MARKER
from drubric_jax.evaluator.rubric_generator import (RubricGenerator, RubricInput,
                                                   response_orders)

PROMPT = "What is the capital of France? Answer in one sentence."
RESPONSES = ["The capital of France is Paris.", "France's capital is Lyon, a big city.",
             "Paris, obviously <3"]


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer):
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def tiny_gen(tiny_model, tok):
    cfg, params = tiny_model
    gen = RubricGenerator(cfg, tok, max_items=2, max_item_chars=10, max_new_tokens=64,
                          input_budget=640)
    return WithParams(gen, params, "generate", "generate_batch")


@pytest.fixture(scope="module")
def batch(tiny_gen):
    inputs = [RubricInput(PROMPT, tuple(RESPONSES)),
              RubricInput("Name a prime.", ("2", "4"),
                          ({"role": "user", "content": "Hi"},
                           {"role": "assistant", "content": "Hello!"}))]
    return tiny_gen.generate_batch(jax.random.PRNGKey(3), inputs, num_lists=2,
                                   temperature=1.0)


def test_generator_returns_valid_padded_arrays(batch, tiny_gen):
    b, g, m = 2, 2, tiny_gen.max_items
    assert batch.weights.shape == batch.item_mask.shape == (b, g, m)
    assert batch.weights.dtype == np.int32 and batch.item_mask.dtype == bool
    assert batch.list_valid.shape == (b, g)
    assert len(batch.texts) == b and all(len(x) == g and all(len(t) == m for t in x)
                                         for x in batch.texts)
    w, mask = batch.weights, batch.item_mask
    assert np.all((w[mask] >= 1) & (w[mask] <= 5)) and np.all(w[~mask] == 0)
    for i in range(b):
        for j in range(g):
            n = int(mask[i, j].sum())
            assert all(batch.texts[i][j][:n]) and not any(batch.texts[i][j][n:])
            assert batch.list_valid[i, j] == (n > 0)
    # orders: permutations of the input's responses, -1 padding for the 2-response input
    assert sorted(batch.orders[0, 0].tolist()) == [0, 1, 2]
    assert sorted(batch.orders[1, 1, :2].tolist()) == [0, 1] and batch.orders[1, 1, 2] == -1
    c = batch.counters
    assert c["lists"] == 4 and c["valid_lists"] == int(batch.list_valid.sum())
    assert c["items_kept"] == int(mask.sum())


def test_constrained_output_always_parses(batch):
    for i in range(2):
        for j in range(2):
            raw, reason = batch.raw_texts[i][j], batch.finish_reasons[i][j]
            if reason == "stop":  # complete under the JSON-schema constraint
                doc = json.loads(raw)
                assert set(doc) == {"rubrics"} and 1 <= len(doc["rubrics"]) <= 2
                for item in doc["rubrics"]:
                    assert 1 <= len(item["rubric"]) <= 10 and 1 <= item["weight"] <= 5
                assert batch.list_valid[i, j] or not any(
                    it["rubric"].strip() for it in doc["rubrics"])
            else:
                assert reason == "length" and not batch.list_valid[i, j]
    assert sum(r == "stop" for x in batch.finish_reasons for r in x) >= 1


def test_grpo_tensors(batch, tiny_gen, tok):
    """The rollout holds the B * G lists as rows b * G + g, grouped by input."""
    n = tiny_gen.max_new_tokens
    ro = batch.rollout
    assert ro.tokens.shape == ro.logprobs.shape == (4, n)
    assert ro.group_ids.tolist() == [0, 0, 1, 1]
    assert ro.prompt_tokens.shape == ro.prompt_mask.shape
    assert ro.prompt_tokens.shape[-1] & (ro.prompt_tokens.shape[-1] - 1) == 0  # pow2
    mask, lp = ro.mask, ro.logprobs
    assert np.all(np.isfinite(lp)) and np.all(lp[mask] <= 0) and np.all(lp[~mask] == 0)
    stops = set(tiny_gen.stop_ids.tolist())
    for i in range(2):
        for j in range(2):
            r = i * 2 + j
            ids = ro.tokens[r][mask[r]].tolist()
            if batch.finish_reasons[i][j] == "stop":
                assert ids[-1] in stops  # mask includes the stop token
                assert tok.decode(ids[:-1]) == batch.raw_texts[i][j]
            assert ro.truncated[r] == (batch.finish_reasons[i][j] == "length")
            prompt = ro.prompt_tokens[r][ro.prompt_mask[r]].tolist()
            assert "Response 1" in tok.decode(prompt)
    assert batch.temperature == 1.0


def test_responses_labelled_in_key_order(tiny_gen, tok):
    order = [2, 0, 1]
    ids, cut, pcut = tiny_gen.prompt_ids(PROMPT, RESPONSES, order=order)
    text = tok.decode(ids)
    for p, i in enumerate(order):
        assert f"[Response {p + 1}]\n{RESPONSES[i]}\n" in text
    assert cut == [False] * 3 and not pcut
    a = tiny_gen.generate(jax.random.PRNGKey(0), PROMPT, RESPONSES, num_lists=3,
                          temperature=0.0)
    b = tiny_gen.generate(jax.random.PRNGKey(0), PROMPT, RESPONSES, num_lists=3,
                          temperature=0.0)
    np.testing.assert_array_equal(a.orders, b.orders)
    np.testing.assert_array_equal(a.rollout.tokens, b.rollout.tokens)
    assert a.weights.shape == (3, 2)  # no B axis from `generate`
    for j in range(3):
        shown = tok.decode(a.rollout.prompt_tokens[j][a.rollout.prompt_mask[j]].tolist())
        first = RESPONSES[a.orders[j, 0]]
        assert f"[Response 1]\n{first}\n" in shown


def _order_by_row(order_key, row_id, size):
    """The per-row draw `response_orders` batches (one eager call and host sync per row)."""
    return np.asarray(jax.random.permutation(jax.random.fold_in(order_key, row_id), size))


def test_response_orders_equal_the_per_row_loop(batch):
    """`response_orders` (one vmapped call per response count) gives the permutations of
    the per-row loop it replaced, for mixed counts and any row ids; the generator's orders
    are those permutations of its order key (the first half of its key's split)."""
    key = jax.random.PRNGKey(11)
    row_ids = [0, 7, 3, 12, 5, 2 ** 20 + 1, 9]
    sizes = [3, 2, 3, 8, 1, 8, 5]
    got = response_orders(key, row_ids, sizes)
    for r, size, perm in zip(row_ids, sizes, got):
        np.testing.assert_array_equal(perm, _order_by_row(key, r, size))
        assert perm.dtype == np.int32 and sorted(perm.tolist()) == list(range(size))
    order_key = jax.random.split(jax.random.PRNGKey(3))[0]  # the `batch` fixture's key
    for b, k in enumerate([3, 2]):
        for g in range(2):
            # One order an input (its global index), shown to each of its G lists.
            np.testing.assert_array_equal(batch.orders[b, g, :k], _order_by_row(order_key, b, k))
            assert (batch.orders[b, g, k:] == -1).all()


def test_an_input_s_lists_share_one_prompt_unless_orders_per_list(tiny_model, tok, batch):
    """By default an input's G lists see its responses in one drawn order, so their prompts
    are one token sequence (the update runs it once: `train_step.group_batch` accepts the
    group); with orders_per_list each list draws its own order, by its row id b * G + g,
    and a group's prompts differ (the grouped update refuses them)."""
    from drubric_jax.rl import train_step as ts

    ro = batch.rollout
    for b in range(2):
        rows = np.flatnonzero(ro.group_ids == b)
        assert len(rows) == 2
        np.testing.assert_array_equal(ro.prompt_tokens[rows[0]], ro.prompt_tokens[rows[1]])
    ones = (np.ones(ro.num_rows, np.float32), np.ones(ro.num_rows, bool))
    assert ts.group_batch(ro, *ones).tokens.shape[:2] == (2, 2)
    cfg, params = tiny_model
    per_list = RubricGenerator(cfg, tok, max_items=2, max_item_chars=10, max_new_tokens=64,
                               input_budget=640, orders_per_list=True)
    inputs = [RubricInput(PROMPT, tuple(RESPONSES))]
    got = per_list.generate_batch(params, jax.random.PRNGKey(3), inputs, num_lists=4,
                                  temperature=1.0)
    order_key = jax.random.split(jax.random.PRNGKey(3))[0]
    for g in range(4):
        np.testing.assert_array_equal(got.orders[0, g], _order_by_row(order_key, g, 3))
    assert len({tuple(o) for o in got.orders[0].tolist()}) > 1  # 4 draws of 3! = 6 orders
    with pytest.raises(ValueError, match="different prompts"):
        ts.group_batch(got.rollout, np.ones(4, np.float32), np.ones(4, bool))


def test_static_variant_shows_no_responses(tiny_gen, tok):
    out = tiny_gen.generate(jax.random.PRNGKey(1), PROMPT, RESPONSES, num_lists=2,
                            static=True)
    for j in range(2):
        text = tok.decode(out.rollout.prompt_tokens[j][out.rollout.prompt_mask[j]].tolist())
        assert PROMPT in text and "Response 1" not in text
        assert all(r not in text for r in RESPONSES)
        assert prompts.GENERATOR_SYSTEM_STATIC.split("\n")[0] in text
    assert out.orders.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert out.weights.shape == (2, 2)


def test_budget_truncation_puts_marker_in(tiny_gen, tok):
    long = " ".join(f"token{i}" for i in range(3000))
    responses = [RESPONSES[0], long, long + " extra"]
    ids, cut, pcut = tiny_gen.prompt_ids(PROMPT, responses, order=[0, 1, 2])
    assert len(ids) <= tiny_gen.input_budget
    assert cut == [False, True, True] and not pcut
    text = tok.decode(ids)
    assert text.count(TRUNCATION_MARKER) == 2
    assert RESPONSES[0] in text and PROMPT in text
    # equal shares for the two long responses (water-filling)
    body1 = text.split("[Response 2]\n")[1].split(TRUNCATION_MARKER)[0]
    body2 = text.split("[Response 3]\n")[1].split(TRUNCATION_MARKER)[0]
    n1 = len(tok.encode(body1, add_special_tokens=False))
    n2 = len(tok.encode(body2, add_special_tokens=False))
    assert abs(n1 - n2) <= 3


def test_bad_arguments(tiny_gen):
    with pytest.raises(ValueError, match="no responses"):
        tiny_gen.generate_batch(jax.random.PRNGKey(0), [RubricInput(PROMPT)], num_lists=1)
    with pytest.raises(ValueError, match="num_lists"):
        tiny_gen.generate(jax.random.PRNGKey(0), PROMPT, RESPONSES, num_lists=0)


@pytest.mark.real_model
@pytest.mark.slow
def test_real_model_writes_parseable_rubrics(smollm2):
    cfg, params, tok = smollm2
    gen = RubricGenerator(cfg, tok, max_items=4, max_item_chars=100,
                          max_new_tokens=160, input_budget=1024)
    out = gen.generate(params, jax.random.PRNGKey(0), PROMPT, RESPONSES, num_lists=2,
                       temperature=0.7)
    for j in range(2):
        if out.finish_reasons[j] == "stop":
            json.loads(out.raw_texts[j])
    assert out.list_valid.any()


def test_rubric_lists_sampled_in_micro_batches(tiny_model, tok):
    """rows_per_call = 3 of 4 lists: two sampler calls, the same padded arrays and one
    finish reason per list (the grammar state is read after each call)."""
    cfg, params = tiny_model
    gen = RubricGenerator(cfg, tok, max_items=2, max_item_chars=10, max_new_tokens=48,
                          input_budget=640, rows_per_call=3)
    inputs = [RubricInput(PROMPT, tuple(RESPONSES)), RubricInput("Name a prime.", ("2", "4"))]
    out = gen.generate_batch(params, jax.random.PRNGKey(3), inputs, num_lists=2)
    assert out.rollout.num_rows == 4 and out.weights.shape == (2, 2, 2)
    assert out.rollout.group_ids.tolist() == [0, 0, 1, 1]
    assert all(r in ("stop", "length", "invalid") for x in out.finish_reasons for r in x)


@pytest.mark.slow
def test_engine_sampler_writes_the_static_lists(tiny_model, tok):
    """sampler = "engine" (3 decode slots for 2 inputs x G = 3 lists, one llguidance
    matcher a slot, each list's grammar state read as its row ends) writes the lists of the
    static sampler with per-row draws: the same texts, weights, item masks, finish
    reasons and tokens, and log-probs within float32 rounding."""
    from tolerances import logprob_atol

    cfg, params = tiny_model
    inputs = [RubricInput(PROMPT, tuple(RESPONSES)), RubricInput("Name a prime.", ("2", "4"))]
    out = {}
    for sampler in ("static", "engine"):
        gen = RubricGenerator(cfg, tok, max_items=2, max_item_chars=10, max_new_tokens=48,
                              input_budget=640, rows_per_call=3, per_row_keys=True,
                              sampler=sampler)
        out[sampler] = gen.generate_batch(params, jax.random.PRNGKey(5), inputs,
                                          num_lists=3, temperature=1.0)
    static, engine = out["static"], out["engine"]
    assert engine.texts == static.texts and engine.finish_reasons == static.finish_reasons
    np.testing.assert_array_equal(engine.weights, static.weights)
    np.testing.assert_array_equal(engine.item_mask, static.item_mask)
    np.testing.assert_array_equal(engine.rollout.tokens, static.rollout.tokens)
    np.testing.assert_allclose(engine.rollout.logprobs, static.rollout.logprobs, rtol=0,
                               atol=logprob_atol(static.rollout.logprobs, cfg.vocab_size))
    assert {r for x in engine.finish_reasons for r in x} & {"stop", "length"}
    with pytest.raises(ValueError, match="sampler"):
        RubricGenerator(cfg, tok, sampler="vllm")
