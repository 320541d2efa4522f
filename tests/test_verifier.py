"""Tests of the frozen verifier (drubric_jax/evaluator/verifier.py) and of verdicts
(drubric_jax/evaluator/verdicts.py): yes/no variants, P(yes) (METHOD 11, case-14), prefix sharing ==
naive, budgets, order bookkeeping (case-15)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from with_params import WithParams

from drubric_jax import models
from drubric_jax.rl import rewards
from drubric_jax.sampling.buckets import left_pad
from drubric_jax.evaluator import verdicts
from drubric_jax.evaluator import verifier as ver_lib
from drubric_jax.evaluator import budgets, passes
from drubric_jax.text import prompts
from drubric_jax.text.budget import TRUNCATION_MARKER

TOL = 1e-4


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer):
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def tiny_verifier(tiny_model, tok):
    cfg, params = tiny_model
    ver = ver_lib.Verifier(cfg, tok, max_prefix_tokens=192, max_suffix_tokens=48)
    return WithParams(ver, params, "p_yes", "p_yes_ids")


PROMPTS = ["What is the capital of France?", "Write a haiku about rain.",
           "List two prime numbers."]
RESPONSES = ["The capital of France is Paris.",
             "Rain on the roof\nsoft drums in the night\nsleep comes slowly",
             "2 and 3 <b>are</b> prime."]
ITEMS = ["The response answers the question directly.", "The response is polite.",
         "The response mentions a number."]


# --------------------------------------------------------------------------- yes / no


class _FakeTokenizer:
    """Word-level tokenizer with a made-up vocabulary (ids are not SmolLM2's)."""

    def __init__(self, vocab):
        self.vocab = vocab
        self.inv = {i: w for w, i in vocab.items()}

    def encode(self, text, add_special_tokens=False):
        if text in self.vocab:
            return [self.vocab[text]]
        return [self.vocab.get(ch, 0) for ch in text]

    def decode(self, ids):
        return "".join(self.inv.get(i, "?") for i in ids)


def test_yes_no_variants_found_from_tokenizer(tok):
    yes, no = verdicts.yes_no_token_ids(tok)
    for text in (" yes", "Yes", " Yes", "yes"):
        ids = tok.encode(text, add_special_tokens=False)
        assert len(ids) == 1 and ids[0] in yes.tolist(), text
    for text in (" no", "No", " No", "no"):
        ids = tok.encode(text, add_special_tokens=False)
        assert len(ids) == 1 and ids[0] in no.tolist(), text
    for i in yes.tolist():
        assert tok.decode([i]).strip().lower() == "yes"
    for i in no.tolist():
        assert tok.decode([i]).strip().lower() == "no"
    assert not set(yes.tolist()) & set(no.tolist())
    # multi-token spellings are not variants ("YES" is two tokens in SmolLM2)
    if len(tok.encode("YES", add_special_tokens=False)) > 1:
        assert all(tok.decode([i]) != "YES" for i in yes.tolist())


def test_yes_no_variants_not_hard_coded():
    fake = _FakeTokenizer({"Yes": 7, " yes": 11, "no": 3, " NO": 40, "x": 1})
    yes, no = verdicts.yes_no_token_ids(fake)
    assert yes.tolist() == [7, 11] and no.tolist() == [3, 40]
    with pytest.raises(ValueError, match="yes"):
        verdicts.yes_no_token_ids(_FakeTokenizer({"no": 3}))


def test_case_14_first_token_probs_sum_all_variants(tok, load_case):
    case = load_case("case-14")
    probs = (case["input"]["first_token_probs"] if case else
             {"Yes": 0.3, " Yes": 0.25, "No": 0.4, " no": 0.05})
    expected = case["expected"]["first_token_probs"] if case else {"p_yes": 0.55, "v": 1}
    yes, no = verdicts.yes_no_token_ids(tok)
    logits = np.full((tok.vocab_size,), -1e9, np.float32)
    rest = 1.0 - sum(probs.values())
    logits[100] = np.log(rest) if rest > 0 else -1e9  # leftover mass on an unrelated token
    for text, p in probs.items():
        (i,) = tok.encode(text, add_special_tokens=False)
        assert i in yes.tolist() + no.tolist()
        logits[i] = np.log(p)
    p_yes = float(verdicts.p_yes_from_logits(jnp.asarray(logits), jnp.asarray(yes),
                                            jnp.asarray(no)))
    assert p_yes == pytest.approx(expected["p_yes"], abs=1e-5)
    assert verdicts.verdicts_from_p_yes(p_yes) == expected["v"]
    # the wrong reading (only "Yes" vs "No") would give 0.3 / 0.7 < 0.5
    assert probs["Yes"] / (probs["Yes"] + probs["No"]) < 0.5


def test_p_yes_is_ratio_of_summed_probabilities():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 50)).astype(np.float32) * 3
    yes, no = np.array([3, 9, 20]), np.array([4, 30])
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = p[:, yes].sum(-1) / (p[:, yes].sum(-1) + p[:, no].sum(-1))
    got = np.asarray(verdicts.p_yes_from_logits(jnp.asarray(logits), jnp.asarray(yes),
                                               jnp.asarray(no)))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert verdicts.verdicts_from_p_yes(np.array([0.5, 0.5001, 0.2])).tolist() == [0, 1, 0]


# --------------------------------------------------------------------------- prefix sharing


def test_prepare_splits_at_a_token_boundary(tiny_verifier, tok):
    pre, sufs = tiny_verifier.prepare(PROMPTS[0], RESPONSES[0], ITEMS + [""])
    assert sufs[-1] == []
    for item, suf in zip(ITEMS, sufs):
        msgs = prompts.verifier_prefix_messages(PROMPTS[0], RESPONSES[0])
        msgs[-1]["content"] += prompts.verifier_item_suffix(item)
        full = tok.encode(tiny_verifier.render(msgs), add_special_tokens=False)
        assert pre + suf == full


def test_prefix_shared_matches_naive_tiny(tiny_model, tok):
    cfg, params = tiny_model
    # small budgets force several prefill chunks and item chunks
    ver = WithParams(ver_lib.Verifier(cfg, tok, 192, 48, cache_slots_budget=1024,
                                      prefill_tokens_budget=256, max_rows=2, item_chunk=2),
                     params, "p_yes", "p_yes_ids")
    items = [ITEMS, ITEMS[:1], ITEMS[1:] + ["", "Another criterion."]]
    history = [[], [{"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello! How can I help?"}], []]
    shared = ver.p_yes(PROMPTS, RESPONSES, items, history)
    naive = ver.p_yes(PROMPTS, RESPONSES, items, history, shared_prefix=False)
    assert shared.shape == naive.shape == (3, 4)
    np.testing.assert_allclose(shared, naive, atol=TOL)
    assert shared[1, 1:].tolist() == [0, 0, 0] and shared[2, 2] == 0  # padding
    assert shared[0, 3] == 0 and np.all((shared[0, :3] > 0) & (shared[0, :3] < 1))


def test_pass_budgets_by_hand(tiny_model, tok):
    """Rows and items per pass (`budgets.PassBudgets`) at hand-worked shapes; a Verifier
    holds the budgets it was given, rounded down to powers of two where they are used."""
    b = budgets.DEFAULT_BUDGETS  # 32768 slots, 8192 prefill tokens, 8 rows, 16 items
    # P = 512, Ts = 32: 32768 // 544 = 60 repeated rows fit, so the item chunk 16 binds,
    # or the power-of-two bucket of the widest row's items (3 -> 4).
    assert b.items_per_pass(512, 32, 16) == 16 and b.items_per_pass(512, 32, 3) == 4
    # Rows: min(8, 8192 // 512 = 16, 32768 // (544 * 16) = 3 -> 2) = 2.
    assert b.rows_per_pass(512, 32, 16) == 2
    assert b.rows_per_full_pass(128) == 64 and b.rows_per_full_pass(1024) == 8
    odd = budgets.PassBudgets(max_rows=6, item_chunk=5)
    assert odd.items_per_pass(16, 16, 16) == 4 and odd.rows_per_pass(16, 16, 16) == 4
    assert budgets.suffix_bucket(35) == 48 and budgets.suffix_bucket(0) == 16
    cfg, _ = tiny_model
    assert ver_lib.Verifier(cfg, tok, 192, 48).chunking == b
    assert ver_lib.Verifier(cfg, tok, 192, 48, max_rows=6, item_chunk=5).chunking == odd


def test_left_pad_filler_rows_hold_one_masked_in_pad_token():
    """The verifier's passes are padded with filler rows (`left_pad(rows=)`): a row of
    pad ids whose last position is masked in, so that no row attends to nothing."""
    tokens, mask = left_pad([[5, 6], [7]], 4, pad_id=0, rows=3)
    assert tokens.tolist() == [[0, 0, 5, 6], [0, 0, 0, 7], [0, 0, 0, 0]]
    assert mask.tolist() == [[False, False, True, True], [False, False, False, True],
                             [False, False, False, True]]
    empty_tokens, empty_mask = left_pad([], 2, pad_id=9, rows=2)
    assert empty_tokens.tolist() == [[9, 9]] * 2 and empty_mask.tolist() == [[False, True]] * 2
    with pytest.raises(ValueError):
        left_pad([[1], [2]], 4, pad_id=0, rows=1)


def test_no_recompile_for_new_lengths_in_a_bucket(tiny_verifier):
    tiny_verifier.p_yes(PROMPTS[0], RESPONSES[:1], ITEMS)
    before = passes.score_suffixes._cache_size(), passes.prefill._cache_size()
    tiny_verifier.p_yes("What is the capital of Spain?", ["Madrid."], ITEMS)
    after = passes.score_suffixes._cache_size(), passes.prefill._cache_size()
    assert after == before


def test_long_response_cut_to_budget_with_marker(tiny_verifier, tok):
    long = " ".join(f"word{i}" for i in range(2000))
    pre, sufs = tiny_verifier.prepare(PROMPTS[0], long, ITEMS[:1])
    assert len(pre) <= tiny_verifier.max_prefix_tokens
    assert TRUNCATION_MARKER.strip() in tok.decode(pre)
    assert "[End of Response]" in tok.decode(pre)
    long_item = "The response " + "is very clear and " * 60
    _, sufs = tiny_verifier.prepare(PROMPTS[0], RESPONSES[0], [long_item])
    assert len(sufs[0]) <= tiny_verifier.max_suffix_tokens
    p = tiny_verifier.p_yes(PROMPTS[0], [long], [long_item])
    assert p.shape == (1, 1) and 0 < p[0, 0] < 1


# --------------------------------------------------------------------------- order bookkeeping


def restore_order(values, order, axis=0):
    """Values given in presentation order back in original order: slot j showed response
    order[j], so out[order[j]] = values[j] along `axis`."""
    values, order = np.asarray(values), np.asarray(order)
    if sorted(order.tolist()) != list(range(values.shape[axis])):
        raise ValueError(f"order must be a permutation, got {order.tolist()}")
    out = np.empty_like(values)
    idx = [slice(None)] * values.ndim
    idx[axis] = order
    out[tuple(idx)] = values
    return out


def test_case_15_shuffled_verdicts_mapped_back(load_case):
    case = load_case("case-15")
    if case is None:
        weights, order = [2, 1, 3], [2, 0, 3, 1]
        returned = [[0, 1, 0, 1], [1, 1, 1, 1], [0, 1, 0, 0]]
        want_e, want_disc = [1.0, 0.5, 0.166667, 0.166667], 0.177083
    else:
        weights = case["input"]["weights"]
        order = case["input"]["shuffle_test"]["presentation_order"]
        returned = case["input"]["shuffle_test"]["verdicts_as_returned"]
        want_e = case["expected"]["shuffle_test"]["E_per_response_in_original_order"]
        want_disc = case["expected"]["shuffle_test"]["R_disc"]
    # verdicts[m][j]: item m, presentation slot j -> responses-by-items in original order
    v = restore_order(np.asarray(returned, np.float32).T, order, axis=0)
    w = np.asarray(weights, np.float32)
    mask = np.ones(len(weights), bool)
    scores, valid = rewards.rubric_scores(v, w, mask)
    np.testing.assert_allclose(np.asarray(scores), want_e, atol=1e-5)
    assert bool(valid)
    disc = rewards.discriminability_reward(v, w, mask)
    assert float(disc) == pytest.approx(want_disc, abs=1e-5)
    with pytest.raises(ValueError):
        restore_order(v, [0, 0, 1, 2], axis=0)


def test_p_yes_follows_the_response_not_its_position(tiny_verifier):
    perm = [2, 0, 1]
    base = tiny_verifier.p_yes(PROMPTS, RESPONSES, ITEMS)
    shown = tiny_verifier.p_yes([PROMPTS[i] for i in perm], [RESPONSES[i] for i in perm], ITEMS)
    np.testing.assert_allclose(restore_order(shown, perm, axis=0), base, atol=1e-6)


# --------------------------------------------------------------------------- real model


@pytest.mark.real_model
def test_real_model_prefix_shared_matches_naive(smollm2):
    cfg, params, tok = smollm2
    ver = WithParams(ver_lib.Verifier(cfg, tok, 256, 64), params, "p_yes", "p_yes_ids")
    items = ["The response states that Paris is the capital.", "The response is in French."]
    shared = ver.p_yes(PROMPTS[0], ["The capital of France is Paris.", "It is Lyon."], items)
    naive = ver.p_yes(PROMPTS[0], ["The capital of France is Paris.", "It is Lyon."], items,
                      shared_prefix=False)
    np.testing.assert_allclose(shared, naive, atol=TOL)
    assert np.all((shared > 0) & (shared < 1))


# --------------------------------------------------------------------------- verdict modes


def test_verdict_modes_and_contextual_calibration_by_hand():
    p = np.array([0.3, 0.5, 0.51, 0.9], np.float32)
    assert verdicts.verdicts_from_p_yes(p, "hard").tolist() == [0, 0, 1, 1]
    np.testing.assert_array_equal(verdicts.verdicts_from_p_yes(p, "soft"), p)
    with pytest.raises(ValueError, match="verdict mode"):
        verdicts.verdicts_from_p_yes(p, "fuzzy")
    # Hand-made logit table: logit P(x, y) = 0.2, logit P(x, N/A) = -0.6 -> sigmoid(0.8).
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    got = verdicts.contextual_calibration(sig(0.2), sig(-0.6))
    assert float(got) == pytest.approx(sig(0.8), abs=1e-6)
    # A response judged as the content-free one gets exactly 0.5.
    assert float(verdicts.contextual_calibration(0.37, 0.37)) == pytest.approx(0.5, abs=1e-6)


def test_contextual_calibration_costs_one_null_row_per_prompt(tiny_verifier):
    """Calibration appends one N/A prefix per distinct prompt, scored on that prompt's
    distinct items: one extra suffix row per item and prompt, not a pass per response."""
    items = [ITEMS, ITEMS, ITEMS[:2]]
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1]]
    plain, cal = {}, {}
    raw = tiny_verifier.p_yes(prompts, RESPONSES, items, stats=plain)
    got = tiny_verifier.p_yes(prompts, RESPONSES, items, calibration="contextual", stats=cal)
    assert cal["prefixes"] - plain["prefixes"] == 2          # two distinct prompts
    assert cal["judgements"] - plain["judgements"] == 3 + 2  # their distinct items
    null = tiny_verifier.p_yes([PROMPTS[0], PROMPTS[1]], [verdicts.NULL_RESPONSE] * 2,
                               [ITEMS, ITEMS[:2]])
    want = verdicts.contextual_calibration(raw[0, :3], null[0, :3])
    np.testing.assert_allclose(got[0, :3], want, atol=1e-5)
    want = verdicts.contextual_calibration(raw[2, :2], null[1, :2])
    np.testing.assert_allclose(got[2, :2], want, atol=1e-5)
    assert got[2, 2] == 0.0  # padding stays 0


@pytest.mark.parametrize("shape", [(2, 2, 2), (1, 8, 1)])
def test_verifier_on_a_mesh_equals_one_device(tiny_model, tok, shape):
    """Rows split over (data, fsdp), params over fsdp / tensor: P(yes) equals the 1-device
    values (the sharded matmuls sum in another order: float32 ulps of P <= 1)."""
    from drubric_jax import parallel

    cfg, params = tiny_model
    mesh = parallel.make_mesh(*shape)
    sharded = jax.device_put(params, models.param_shardings(params, mesh))
    one = ver_lib.Verifier(cfg, tok, 192, 48)
    many = ver_lib.Verifier(cfg, tok, 192, 48, mesh=mesh)
    items = [ITEMS, ITEMS[:2], ITEMS[1:]]
    want = one.p_yes(params, PROMPTS, RESPONSES, items)
    got = many.p_yes(sharded, PROMPTS, RESPONSES, items)
    np.testing.assert_allclose(got, want, atol=1e-5)
    ids = [tok.encode("Is the sky blue? Answer Yes or No.", add_special_tokens=False)] * 3
    np.testing.assert_allclose(many.p_yes_ids(sharded, ids), one.p_yes_ids(params, ids),
                               atol=1e-5)
