"""Tests for drubric_jax.rl.rewards: Eq. 12, 13, 15, 2, 21, 24-25 (METHOD 3, 11)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from drubric_jax.rl import advantages
from drubric_jax.rl import rewards
from tolerances import close

PROPERTY = settings(max_examples=30, deadline=None)
# Advantages are O(1) (|A| <= sqrt(G - 1)); two compiled programs of the same formula (other
# shapes, other fusion) may round a division differently: a few float32 ulps of 1.
ULPS_O1 = 8 * float(np.finfo(np.float32).eps)
# Jitted once: the fuzz test's examples then cost microseconds each.
JIT_GROUP_ADV = jax.jit(advantages.group_advantages)
JIT_GROUP_ADV_1 = jax.jit(advantages.group_advantages)


def log_sigmoid(x):
    return -math.log1p(math.exp(-x))


# --- Eq. 12 rubric scores -----------------------------------------------------

# case-15 verdicts, transposed to the module's responses-by-items layout.
V15_KM = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], np.float32).T
W15 = np.array([2, 1, 3])


def test_rubric_scores_hand_computed():
    scores, valid = rewards.rubric_scores(V15_KM, W15, np.ones(3, bool))
    close(scores, [1.0, 0.5, 1 / 6, 1 / 6])
    assert bool(valid)


def test_rubric_scores_drop_invalid_weights_and_padding():
    # Items 3..6: weight 0, weight 6, weight 2.5, padded (NaN verdicts): dropped.
    v = np.concatenate([V15_KM, np.ones((4, 3), np.float32),
                        np.full((4, 1), np.nan, np.float32)], axis=1)
    w = np.array([2, 1, 3, 0, 6, 2.5, 4])
    mask = np.array([1, 1, 1, 1, 1, 1, 0], bool)
    scores, valid = rewards.rubric_scores(v, w, mask)
    close(scores, [1.0, 0.5, 1 / 6, 1 / 6])
    assert bool(valid)
    close(rewards.valid_items(w, mask), [1, 1, 1, 0, 0, 0, 0])


def test_rubric_scores_batched():
    v = np.stack([V15_KM, 1 - V15_KM])
    w = np.stack([W15, W15])
    scores, valid = rewards.rubric_scores(v, w, np.ones((2, 3), bool))
    close(scores, [[1.0, 0.5, 1 / 6, 1 / 6], [0.0, 0.5, 5 / 6, 5 / 6]])
    assert np.asarray(valid).tolist() == [True, True]


def test_rubric_scores_empty_rubric_is_zero_and_invalid():
    scores, valid = rewards.rubric_scores(np.zeros((4, 0)), np.zeros((0,)), np.zeros((0,), bool))
    close(scores, np.zeros(4))
    assert not bool(valid)


# --- Eq. 13 discriminability ----------------------------------------------------

def test_discriminability_hand_computed():
    # vbar = [0.5, 1, 0.25]; (2*0.25 + 0 + 3*0.1875) / 6
    r = rewards.discriminability_reward(V15_KM, W15, np.ones(3, bool))
    close(r, 1.0625 / 6)


def test_discriminability_response_mask_ignores_padding_rows():
    v = np.concatenate([V15_KM, np.full((2, 3), np.nan, np.float32)], axis=0)
    mask = np.array([1, 1, 1, 1, 0, 0], bool)
    r = rewards.discriminability_reward(v, W15, np.ones(3, bool), mask)
    close(r, 1.0625 / 6)


def test_discriminability_no_responses_or_no_items_is_zero():
    assert float(rewards.discriminability_reward(V15_KM, W15, np.ones(3, bool),
                                                 np.zeros(4, bool))) == 0.0
    assert float(rewards.discriminability_reward(V15_KM, W15, np.zeros(3, bool))) == 0.0


def test_case_15_r_disc_population_variance_and_shuffle(load_case):
    case = load_case("case-15")
    weights, verdicts_mk = W15, V15_KM.T
    perm = np.array([2, 0, 3, 1])
    returned_mk = np.array([[0, 1, 0, 1], [1, 1, 1, 1], [0, 1, 0, 0]], np.float32)
    expected_r, expected_e = 0.177083, [1.0, 0.5, 0.166667, 0.166667]
    if case is not None:
        weights = np.array(case["input"]["weights"])
        verdicts_mk = np.array(case["input"]["verdicts"], np.float32)
        perm = np.array(case["input"]["shuffle_test"]["presentation_order"])
        returned_mk = np.array(case["input"]["shuffle_test"]["verdicts_as_returned"], np.float32)
        expected_r = case["expected"]["R_disc"]
        expected_e = case["expected"]["E_per_response"]
        assert case["expected"]["shuffle_test"]["R_disc"] == expected_r
    mask = np.ones(len(weights), bool)
    r = rewards.discriminability_reward(verdicts_mk.T, weights, mask)
    e, _ = rewards.rubric_scores(verdicts_mk.T, weights, mask)
    close(r, expected_r, 1e-6)
    close(e, expected_e, 1e-6)
    for wrong in (0.236111, 0.145833, 0.383173):  # Bessel, unweighted, std
        assert abs(float(r) - wrong) > 1e-3
    # Column j of the verifier's answer belongs to response perm[j]: scatter back.
    unshuffled = np.empty_like(returned_mk)
    unshuffled[:, perm] = returned_mk
    close(unshuffled, verdicts_mk)
    close(rewards.discriminability_reward(unshuffled.T, weights, mask), expected_r, 1e-6)
    close(rewards.rubric_scores(unshuffled.T, weights, mask)[0], expected_e, 1e-6)


# --- Eq. 15 anchor reward ---------------------------------------------------------

def test_anchor_reward_hand_computed():
    s = [1.0, 0.5, 0.0]
    want = log_sigmoid(0.5) / 1 + log_sigmoid(1.0) / 2 + log_sigmoid(0.5) / (1 * 2)
    close(rewards.anchor_reward(s, [0, 1, 2]), want, 1e-6)
    # Padding anchors with garbage change nothing.
    close(rewards.anchor_reward([1.0, 0.5, np.nan, 0.0], [0, 1, 99, 2],
                                [True, True, False, True]), want, 1e-6)


def test_anchor_reward_tied_gold_ranks():
    # gold [0, 0, 1]: positions [1, 1, 3]; only pairs (0,2), (1,2), each 1/(2*1).
    s = [0.8, 0.2, 0.5]
    want = log_sigmoid(0.3) / 2 + log_sigmoid(-0.3) / 2
    close(rewards.anchor_reward(s, [0, 0, 1]), want, 1e-6)
    # RM-Bench-like 3 chosen vs 3 rejected: 9 pairs of weight 1/3.
    close(rewards.anchor_reward([1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]),
          9 * log_sigmoid(1.0) / 3, 1e-6)


def test_anchor_reward_floor_values():
    close(rewards.anchor_reward_floor([0, 1, 2]), 2 * log_sigmoid(-1.0), 1e-6)
    # N = 7 Nectar: sum_{i<j} 1/((j-i) 2^(i-1)).
    w = sum(1 / ((j - i) * 2 ** (i - 1)) for i in range(1, 8) for j in range(i + 1, 8))
    close(rewards.anchor_reward_floor(np.arange(7)), w * log_sigmoid(-1.0), 1e-5)
    assert float(rewards.anchor_reward_floor([0, 0, 0])) == 0.0


def test_anchor_reward_or_floor_selects_floor_for_invalid():
    scores = np.array([[1.0, 0.5, 0.0], [np.nan, np.nan, np.nan]], np.float32)
    out = rewards.anchor_reward_or_floor(scores, np.tile(np.arange(3), (2, 1)),
                                         None, np.array([True, False]))
    close(out[0], rewards.anchor_reward(scores[0], np.arange(3)))
    close(out[1], 2 * log_sigmoid(-1.0), 1e-6)


# --- Eq. 2 Delta_gap ------------------------------------------------------------------

def test_delta_gap_hand_computed():
    gap, n = rewards.delta_gap([0.9, 0.5, 0.1], [0, 1, 2])
    close(gap, (0.4 + 0.8 + 0.4) / 3)
    assert int(n) == 3
    gap, n = rewards.delta_gap([0.9, 0.5, 0.1, 7.0], [0, 0, 1, 5], [1, 1, 1, 0])
    close(gap, (0.8 + 0.4) / 2)
    assert int(n) == 2
    gap, n = rewards.delta_gap([0.3, 0.6], [1, 1])
    assert float(gap) == 0.0 and int(n) == 0


# --- Eq. 21 group advantages ----------------------------------------------------------

def test_group_advantages_hand_computed():
    adv, flat = advantages.group_advantages(np.array([1.0, 2.0, 3.0, 4.0]))
    close(adv, np.array([-1.5, -0.5, 0.5, 1.5]) / (math.sqrt(5 / 3) + 1e-6))
    assert not bool(flat)


def test_group_advantages_mask_and_group_of_one():
    adv, flat = advantages.group_advantages(
        np.array([[1.0, 2.0, 3.0, np.nan], [5.0, np.inf, 0.0, 0.0]]),
        np.array([[1, 1, 1, 0], [1, 0, 0, 0]], bool))
    close(adv[0], [-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6), 0.0])
    assert np.asarray(adv[1]).tolist() == [0.0, 0.0, 0.0, 0.0]
    assert np.asarray(flat).tolist() == [False, True]


def test_group_advantages_by_id_matches_reshape_under_shuffle():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(3, 4)).astype(np.float32)
    r[1] = 0.35  # a flat group
    ref, ref_flat = advantages.group_advantages(r)
    order = rng.permutation(12)
    ids = np.repeat(np.arange(3), 4)[order]
    adv, flat = advantages.group_advantages_by_id(r.reshape(-1)[order], ids, 3)
    close(adv, np.asarray(ref).reshape(-1)[order], 1e-6)
    assert np.asarray(flat).tolist() == np.asarray(ref_flat).tolist() == [False, True, False]


def test_group_advantages_by_id_masks_and_bad_ids():
    adv, flat = advantages.group_advantages_by_id(
        np.array([1.0, 3.0, np.nan, 2.0, 9.0]), np.array([0, 0, 0, 1, 7]), 2,
        np.array([1, 1, 0, 1, 1], bool))
    close(adv, [-1 / (math.sqrt(2) + 1e-6), 1 / (math.sqrt(2) + 1e-6), 0, 0, 0], 1e-6)
    assert np.asarray(flat).tolist() == [False, True]


def test_non_finite_reward_is_unscorable_and_the_rest_is_normalised_without_it():
    """A NaN / inf reward gets advantage 0 and does not poison its group: the other members
    get exactly what the group without that member gives."""
    for bad in (np.nan, np.inf, -np.inf):
        adv, flat = advantages.group_advantages(np.array([1.0, bad, 2.0, 4.0], np.float32))
        ref, _ = advantages.group_advantages(np.array([1.0, 2.0, 4.0], np.float32))
        a = np.asarray(adv)
        assert a[1] == 0.0 and np.all(np.isfinite(a)) and not bool(flat)
        close(a[[0, 2, 3]], np.asarray(ref), ULPS_O1)
        adv_id, _ = advantages.group_advantages_by_id(
            np.array([1.0, bad, 2.0, 4.0], np.float32), np.zeros(4, np.int32), 1)
        close(adv_id, a, ULPS_O1)
    # A group left with one finite member is flat (its advantage 0).
    adv, flat = advantages.group_advantages(np.array([np.nan, 3.0, np.inf], np.float32))
    assert np.asarray(adv).tolist() == [0.0, 0.0, 0.0] and bool(flat)


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float32, (3, 5), elements=st.floats(
    width=32, allow_nan=True, allow_infinity=True)))
def test_fuzzed_groups_never_give_nan(r):
    """Any float32 rewards (NaN, inf, values near the float32 limit): finite advantages,
    0 at non-finite members, and each group's finite members normalised on their own."""
    adv = np.asarray(JIT_GROUP_ADV(r)[0])
    assert np.all(np.isfinite(adv))
    assert np.all(adv[~np.isfinite(r)] == 0)
    for g in range(3):
        ok = np.isfinite(r[g])
        want = np.asarray(JIT_GROUP_ADV_1(np.where(ok, r[g], 0.0), ok)[0])
        close(adv[g], want, ULPS_O1)


def test_rewards_near_float32_max_do_not_overflow():
    big = np.finfo(np.float32).max
    r = np.array([big, -big, 0.5 * big, 0.0], np.float32)
    adv, flat = advantages.group_advantages(r)
    x = r.astype(np.float64)
    want = (x - x.mean()) / x.std(ddof=1)  # eps is negligible at this scale
    np.testing.assert_allclose(np.asarray(adv), want, rtol=1e-5)
    assert not bool(flat)
    std = float(advantages.group_std(r))
    np.testing.assert_allclose(std, x.std(ddof=1), rtol=1e-5)
    # Ordinary rewards (scaled by 2^k, exactly) give the plain two-pass float32 formula.
    for small in (np.array([0.1, 0.7, 0.3, 0.9], np.float32),
                  np.array([-3.5, -1.25, -0.5, -2.0], np.float32)):
        mean = small.sum(dtype=np.float32) / np.float32(4)
        dev = small - mean
        std = np.sqrt((dev * dev).sum(dtype=np.float32) / np.float32(3))
        close(advantages.group_advantages(small)[0], dev / (std + np.float32(1e-6)), ULPS_O1)


def test_group_std_is_the_eq21_divisor():
    r = np.array([[1.0, 2.0, 3.0, 4.0], [0.3, 0.3, 0.3, 0.3]], np.float32)
    np.testing.assert_allclose(np.asarray(advantages.group_std(r)),
                               [math.sqrt(5 / 3), 0.0], rtol=1e-6)


def test_group_advantages_jit():
    fn = jax.jit(advantages.group_advantages_by_id, static_argnums=2)
    adv, _ = fn(jnp.array([0.1, 0.2, 0.3]), jnp.array([0, 0, 0]), 1)
    assert np.all(np.isfinite(np.asarray(adv)))


def test_case_01_flat_groups_zero_advantage(load_case):
    case = load_case("case-01")
    groups = [[0.35] * 4, [0.35] * 8, [0.1] * 8, [-1.386294] * 8]
    if case is not None:
        groups = [g["rewards"] for g in case["input"]["groups"]]
        assert case["expected"]["group_sum_abs_max"] == 0.001
    for g in groups:
        r = np.asarray(g, np.float32)
        adv, flat = advantages.group_advantages(r)
        assert bool(flat)
        assert np.asarray(adv).tolist() == [0.0] * len(g)  # exactly zero
        ids = np.zeros(len(g), np.int32)
        adv_id, flat_id = advantages.group_advantages_by_id(r, ids, 1)
        assert np.asarray(adv_id).tolist() == [0.0] * len(g)
        assert bool(flat_id[0])
        a_gen, _ = advantages.generator_advantages({"disc": r, "anchor": r},
                                                   {"disc": 1.0, "anchor": 1.0})
        assert np.asarray(a_gen).tolist() == [0.0] * len(g)


# --- Eq. 24-25 generator advantages --------------------------------------------------

def test_case_17_generator_advantage_normalised_separately(load_case):
    case = load_case("case-17")
    main_d, main_a = [0.1, 0.2, 0.3, 0.4], [-1.0, -0.2, -0.3, -0.5]
    const_a = [-0.5] * 4
    want_zd = [-1.161895, -0.387298, 0.387298, 1.161895]
    want_za = [-1.404879, 0.842927, 0.561951, 0.0]
    want_main = [-2.566774, 0.455629, 0.94925, 1.161895]
    want_const = [-1.161895, -0.387298, 0.387298, 1.161895]
    if case is not None:
        main_d, main_a = case["input"]["main"]["R_disc"], case["input"]["main"]["R_anchor"]
        const_a = case["input"]["constant_anchor"]["R_anchor"]
        want_zd = case["expected"]["main"]["z_R_disc"]
        want_za = case["expected"]["main"]["z_R_anchor"]
        want_main = case["expected"]["main"]["A_gen"]
        want_const = case["expected"]["constant_anchor"]["A_gen"]
    # The JSON divides by std exactly; Eq. 21 here adds 1e-6 (|change| <= 1.4e-5).
    tol = 3e-5
    close(advantages.group_advantages(np.array(main_d))[0], want_zd, tol)
    close(advantages.group_advantages(np.array(main_a))[0], want_za, tol)
    weights = {"disc": 1.0, "anchor": 1.0}
    adv, flat = advantages.generator_advantages(
        {"disc": np.array(main_d), "anchor": np.array(main_a)}, weights)
    close(adv, want_main, tol)
    assert not bool(flat["disc"]) and not bool(flat["anchor"])
    for wrong in ([-1.491202, 0.573539, 0.573539, 0.344124],
                  [-2.963855, 0.526115, 1.096099, 1.341641]):
        assert np.max(np.abs(np.asarray(adv) - np.array(wrong))) > 1e-2
    adv, flat = advantages.generator_advantages(
        {"disc": np.array(main_d), "anchor": np.array(const_a)}, weights)
    close(adv, want_const, tol)
    assert bool(flat["anchor"]) and not bool(flat["disc"])
    ids = np.array([0, 0, 0, 0])
    adv_id, _ = advantages.generator_advantages_by_id(
        {"disc": np.array(main_d), "anchor": np.array(main_a)}, weights, ids, 1)
    close(adv_id, want_main, tol)


# --- case-13: empty / all-invalid rubric ----------------------------------------------

def test_case_13_empty_rubric_rewards_and_advantages(load_case):
    case = load_case("case-13")
    k, n_anchor = 4, 3
    naive_tie = -1.386294
    if case is not None:
        k, n_anchor = case["input"]["K"], case["input"]["num_anchors"]
        naive_tie = case["expected"]["naive_R_anchor_if_all_anchor_scores_equal_N3"]
        assert case["expected"]["policy_advantages_for_this_prompt"] == [0.0] * k
    rubrics = {  # "[]" and two weight-0 items (dropped): no valid item either way
        "empty": (np.zeros((k, 0)), np.zeros((0,)), np.zeros((0,), bool)),
        "all_weight_zero": (np.ones((k, 2)), np.array([0, 0]), np.ones(2, bool)),
    }
    gold = np.arange(n_anchor)
    for verdicts, weights, mask in rubrics.values():
        scores, valid = rewards.rubric_scores(verdicts, weights, mask)
        assert not bool(valid)
        assert np.asarray(scores).tolist() == [0.0] * k
        assert float(rewards.discriminability_reward(verdicts, weights, mask)) == 0.0
        adv, flat = advantages.group_advantages(scores)
        assert np.asarray(adv).tolist() == [0.0] * k and bool(flat)
        anchor_scores, _ = rewards.rubric_scores(np.zeros((n_anchor,) + verdicts.shape[1:]),
                                                 weights, mask)
        r_anchor = rewards.anchor_reward_or_floor(anchor_scores, gold, None, valid)
        close(r_anchor, 2 * log_sigmoid(-1.0), 1e-6)  # -2.626523
        assert float(r_anchor) < naive_tie - 1.0
    # The naive value the case warns about is what tied anchors of a VALID rubric get.
    close(rewards.anchor_reward(np.full(n_anchor, 0.4), gold), naive_tie, 1e-6)
    # A valid rubric that ranks anchors backwards is still no worse than the floor.
    assert float(rewards.anchor_reward([0.0, 0.5, 1.0], gold)) >= float(
        rewards.anchor_reward_floor(gold))


# --- properties ------------------------------------------------------------------------

# Jitted once for the fixed property-test shapes (one compile, fast examples).
SCORES, R_DISC, ADV, ADV_BY_ID = (
    jax.jit(rewards.rubric_scores), jax.jit(rewards.discriminability_reward),
    jax.jit(advantages.group_advantages),
    jax.jit(advantages.group_advantages_by_id, static_argnums=2))
ANCHOR, FLOOR = jax.jit(rewards.anchor_reward), jax.jit(rewards.anchor_reward_floor)
K_MAX, M_MAX = 6, 5
verdict_arrays = hnp.arrays(np.float32, (K_MAX, M_MAX), elements=st.sampled_from([0.0, 1.0]))
weight_arrays = hnp.arrays(np.int32, (M_MAX,), elements=st.integers(0, 6))
bool_m = hnp.arrays(bool, (M_MAX,))
bool_k = hnp.arrays(bool, (K_MAX,))


@PROPERTY
@given(verdict_arrays, weight_arrays, bool_m, bool_k, st.randoms(use_true_random=False))
def test_scores_and_r_disc_properties(v, w, item_mask, resp_mask, rnd):
    scores, valid = SCORES(v, w, item_mask)
    r = R_DISC(v, w, item_mask, resp_mask)
    s, r = np.asarray(scores), float(r)
    assert np.all(np.isfinite(s)) and np.all((s >= 0) & (s <= 1))
    assert 0.0 <= r <= 0.25 + 1e-7
    if not bool(valid):
        assert np.all(s == 0) and r == 0.0
    k_perm = np.array(rnd.sample(range(K_MAX), K_MAX))
    m_perm = np.array(rnd.sample(range(M_MAX), M_MAX))
    s_perm, _ = SCORES(v[k_perm][:, m_perm], w[m_perm], item_mask[m_perm])
    close(s_perm, s[k_perm], 1e-6)
    r_perm = R_DISC(v[k_perm][:, m_perm], w[m_perm],
                                             item_mask[m_perm], resp_mask[k_perm])
    close(r_perm, r, 1e-6)
    close(R_DISC(1.0 - v, w, item_mask, resp_mask), r, 1e-6)


reward_values = st.floats(-10.0, 10.0, allow_nan=False, width=32)


@PROPERTY
@given(hnp.arrays(np.float32, (8,), elements=reward_values), hnp.arrays(bool, (8,)),
       st.randoms(use_true_random=False))
def test_group_advantage_properties(r, mask, rnd):
    adv, flat = ADV(r, mask)
    a = np.asarray(adv)
    assert np.all(np.isfinite(a))
    assert np.all(a[~mask] == 0)
    tol = 1e-5  # flat groups: exact zeros, whatever the order
    if mask.sum() <= 1 or bool(flat):
        assert np.all(a == 0)
    else:
        # Eq. 21 in float64 from the same float32 rewards. The eps matters: with it the sum
        # of squares is (n - 1) (std / (std + 1e-6))^2, not n - 1 (a group spread of 5e-6,
        # just above the flatness bound, gives 2.9 instead of 7 for n = 8), so the values
        # themselves are compared.
        x = r[mask].astype(np.float64)
        sd = x.std(ddof=1)
        want = (x - x.mean()) / (sd + 1e-6)
        # float32 two-pass rounding: the mean and each deviation are off by a few ulps of the
        # largest |R| (16 eps32 of it bounds them), which moves A by that over (std + eps)
        # and, through the std, moves A by the same relative amount.
        rel = 16 * np.finfo(np.float32).eps * np.abs(x).max() / (sd + 1e-6)
        tol = rel * (1 + np.abs(want).max()) + 1e-5
        np.testing.assert_allclose(a[mask], want, rtol=0, atol=tol)
    # Another order sums in another order: the same bound, twice (both sides round).
    perm = np.array(rnd.sample(range(8), 8))
    adv_p, _ = ADV(r[perm], mask[perm])
    np.testing.assert_allclose(adv_p, a[perm], rtol=0, atol=2 * tol)
    adv_id, _ = ADV_BY_ID(r[perm], np.zeros(8, np.int32), 1, mask[perm])
    np.testing.assert_allclose(adv_id, a[perm], rtol=0, atol=2 * tol)


@PROPERTY
@given(st.floats(-1e4, 1e4, allow_nan=False, width=32), st.integers(1, 8),
       st.floats(0.0, 0.9))
def test_flat_and_near_flat_groups_give_zero(c, k, frac):
    base = np.full(k, c, np.float32)
    adv, flat = ADV(base)
    assert bool(flat) and np.all(np.asarray(adv) == 0)
    # Perturbation inside the flatness tolerance: still exactly zero.
    tol = 1e-6 * max(1.0, abs(c))
    noisy = base + np.float32(frac * tol) * (np.arange(k) % 2).astype(np.float32)
    adv, _ = ADV(noisy)
    a = np.asarray(adv)
    assert np.all(np.isfinite(a))
    if float(noisy.max() - noisy.min()) <= tol:
        assert np.all(a == 0)


@PROPERTY
@given(hnp.arrays(np.float32, (5,), elements=st.floats(0, 1, width=32)),
       hnp.arrays(np.int32, (5,), elements=st.integers(0, 3)), hnp.arrays(bool, (5,)))
def test_anchor_reward_bounded_by_floor(s, gold, mask):
    r = float(ANCHOR(s, gold, mask))
    floor = float(FLOOR(gold, mask))
    assert np.isfinite(r) and r <= 0.0
    assert floor <= r + 1e-6


# --- Eq. 13 generalised to soft verdicts (METHOD 12) ---------------------------------

def test_soft_discriminability_reduces_to_eq13_for_binary_verdicts():
    rng = np.random.default_rng(3)
    v = (rng.random((5, 6, 4)) > 0.5).astype(np.float32)         # [B, K, M] 0/1
    w = rng.integers(1, 6, size=(5, 4))
    mask = np.ones((5, 4), bool)
    vbar = v.mean(axis=1)
    want = (w * vbar * (1 - vbar)).sum(-1) / w.sum(-1)
    got = np.asarray(rewards.discriminability_reward(v, w, mask))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # The 0/1 branch is the paper's formula itself, whatever else is in the batch.
    soft = v.copy()
    soft[0, 0, 0] = 0.3
    again = np.asarray(rewards.discriminability_reward(soft, w, mask))
    np.testing.assert_array_equal(again[1:], got[1:])


def test_soft_discriminability_is_the_weighted_population_variance():
    v = np.array([[0.3, 0.3], [0.3, 0.9], [0.3, 0.6]], np.float32)  # [K=3, M=2]
    w = np.array([2, 1])
    got = float(rewards.discriminability_reward(v, w, np.ones(2, bool)))
    want = (2 * np.var([0.3, 0.3, 0.3]) + 1 * np.var([0.3, 0.9, 0.6])) / 3
    assert got == pytest.approx(want, abs=1e-7)
    # An item that gives every response the same P(yes) separates nothing: 0, however
    # uncertain.
    assert float(rewards.discriminability_reward(v[:, :1], w[:1], np.ones(1, bool))) == 0.0
