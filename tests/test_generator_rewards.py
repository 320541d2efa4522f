"""The generator rewards' registry (drubric_jax/rl/generator_rewards.py) and Eq. 24-25
generalised to a weighted sum of per-reward group-normalised advantages
(`advantages.generator_advantages(_by_id)`).

The end-to-end recipe test (a toy third reward through the generator phase) is
tests/test_phases.py::test_a_third_generator_reward_is_one_function_and_a_weight.
"""
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from drubric_jax.rl import advantages, generator_rewards, rewards


def _random_rewards(rng, groups: int, g: int):
    """R_disc-like and R_anchor-like rewards of `groups` groups of g lists, rows shuffled
    (groups are formed by id); group 1 has a flat R_anchor, group 2 one real row."""
    r_disc = rng.uniform(0, 0.25, groups * g).astype(np.float32)
    r_anchor = rng.uniform(-3, 0, groups * g).astype(np.float32)
    ids = np.repeat(np.arange(groups, dtype=np.int32), g)
    r_anchor[ids == 1] = -1.5  # a flat R_anchor group
    mask = ~((ids == 2) & (np.arange(groups * g) % g > 0))  # group 2: one real row
    order = rng.permutation(groups * g)
    return r_disc[order], r_anchor[order], ids[order], mask[order]


def test_two_rewards_give_the_old_formula_bitwise():
    """The registry's combination equals the two-reward formula it replaced,

        A = disc_weight * z(R_disc) + lam * z(R_anchor),

    bit for bit, on random inputs (by id and over the last axis; weights of the full
    objective and of both ablations). The bound is 0, not a reassociation bound: each z is
    the same function of the same inputs, and the weighted sum does the same two float32
    products and one float32 addition, disc first, as the old formula; IEEE 754 rounds each
    operation as a function of its operands alone, so nothing can differ.
    """
    rng = np.random.default_rng(0)
    for groups, g in [(1, 4), (3, 4), (5, 8), (4, 2)]:
        r_disc, r_anchor, ids, mask = _random_rewards(rng, groups, g)
        for disc_weight, lam in [(1.0, 1.0), (1.0, 0.0), (0.0, 1.0),
                                 (1.0, float(rng.uniform(0.1, 3.0)))]:
            a_disc, _ = advantages.group_advantages_by_id(r_disc, ids, groups, mask)
            a_anchor, _ = advantages.group_advantages_by_id(r_anchor, ids, groups, mask)
            old = np.asarray(disc_weight * a_disc + lam * a_anchor)
            new, flat = advantages.generator_advantages_by_id(
                {"disc": r_disc, "anchor": r_anchor}, {"disc": disc_weight, "anchor": lam},
                ids, groups, mask)
            assert np.asarray(new).tobytes() == old.tobytes()
            assert set(flat) == {"disc", "anchor"}
            assert groups < 2 or bool(flat["anchor"][1])  # the flat R_anchor group
            # The same over the last axis of a [groups, G] layout.
            grid = [x.reshape(groups, g) for x in (r_disc, r_anchor)]
            z_disc, _ = advantages.group_advantages(grid[0])
            z_anchor, _ = advantages.group_advantages(grid[1])
            old = np.asarray(disc_weight * z_disc + lam * z_anchor)
            new, _ = advantages.generator_advantages(
                {"disc": grid[0], "anchor": grid[1]}, {"disc": disc_weight, "anchor": lam})
            assert np.asarray(new).tobytes() == old.tobytes()


def test_a_weighted_sum_of_any_number_of_rewards():
    """Three rewards: A = sum_n w_n z(R_n), each z its own Eq. 21 normalisation (a flat
    reward adds exactly 0), added in the order given."""
    rng = np.random.default_rng(1)
    r = {name: rng.normal(size=(3, 4)).astype(np.float32) for name in ("a", "b", "c")}
    r["b"][1] = 2.0  # flat in group 1
    w = {"a": 1.0, "b": 0.5, "c": 2.0}
    z = {name: advantages.group_advantages(x)[0] for name, x in r.items()}
    got, flat = advantages.generator_advantages(r, w)
    want = (w["a"] * z["a"] + w["b"] * z["b"]) + w["c"] * z["c"]
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    assert flat["b"].tolist() == [False, True, False]
    with pytest.raises(ValueError, match="same rewards"):
        advantages.generator_advantages(r, {"a": 1.0})
    with pytest.raises(ValueError, match="same rewards"):
        advantages.generator_advantages({}, {})


def test_variant_weights():
    """full reads each row's config field (disc_weight, lam = lambda of Eq. 17), once, in
    `rounds.settings`; the METHOD 6 ablations keep one reward at weight 1 and the rest at
    0; static trains no generator."""
    from drubric_jax.rounds import settings

    gen_cfg = ml_collections.ConfigDict({"disc_weight": 0.75, "lam": 2.0})
    config = ml_collections.ConfigDict({"generator": gen_cfg, "variant": "full"})
    assert settings.generator_reward_weights(config) == {"disc": 0.75, "anchor": 2.0}
    weights = settings.generator_reward_weights(config)
    assert settings.variant_weights(weights, "full") == weights
    assert settings.variant_weights(weights, "static") is None
    assert generator_rewards.variant_weights(weights, "full") == weights
    assert generator_rewards.variant_weights(weights, "disc_only") == {"disc": 1.0,
                                                                       "anchor": 0.0}
    assert generator_rewards.variant_weights(weights, "anchor_only") == {"disc": 0.0,
                                                                         "anchor": 1.0}
    with pytest.raises(ValueError, match="static"):
        generator_rewards.variant_weights(weights, "static")
    with pytest.raises(ValueError, match="anchor"):
        generator_rewards.variant_weights({"disc": 1.0}, "full")


def test_registered_rewards_are_eq13_and_eq15_per_input():
    """The two rows on a batch of inputs with ragged anchor lists equal Eq. 13 and Eq. 15
    (floor for an invalid list) of each input alone, its anchor list unpadded: padding is
    masked out. Equal to float32 rounding: the padded sums add exact zeros but may group
    the nonzero terms differently (a few ulps of the Eq. 15 sum, |R_anchor| < 10)."""
    rng = np.random.default_rng(2)
    b, g, k, a_max, m = 3, 2, 4, 5, 3
    sizes = np.array([5, 3, 2])
    anchor_mask = np.arange(a_max)[None] < sizes[:, None]
    inputs = generator_rewards.RewardInputs(
        verdicts=rng.random((b, g, k, m)).astype(np.float32),
        anchor_verdicts=np.where(anchor_mask[:, None, :, None],
                                 rng.random((b, g, a_max, m)), 0).astype(np.float32),
        weights=rng.integers(1, 6, (b, g, m)).astype(np.int32),
        item_mask=rng.random((b, g, m)) < 0.8, list_valid=np.array([[True, False]] * b),
        gold_ranks=np.where(anchor_mask, np.arange(a_max)[None], 99).astype(np.int32),
        anchor_mask=anchor_mask)
    got = generator_rewards.generator_rewards(inputs)
    assert list(got) == ["disc", "anchor"] and got["disc"].shape == (b, g)
    tol = 16 * float(np.finfo(np.float32).eps) * 10
    for i in range(b):
        for j in range(g):
            w, im = inputs.weights[i, j], inputs.item_mask[i, j]
            np.testing.assert_array_equal(
                got["disc"][i, j], rewards.discriminability_reward(inputs.verdicts[i, j], w, im))
            s, _ = rewards.rubric_scores(inputs.anchor_verdicts[i, j, :sizes[i]], w, im)
            want = rewards.anchor_reward_or_floor(s, jnp.arange(sizes[i]), None,
                                                  inputs.list_valid[i, j])
            np.testing.assert_allclose(got["anchor"][i, j], want, rtol=0, atol=tol)
