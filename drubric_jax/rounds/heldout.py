"""The held-out evaluation of a round: Delta_gap (Eq. 2) and R_anchor (Eq. 15) of the
current generator + frozen verifier on anchor lists never trained on.

    heldout_metrics       one rubric list per held-out anchor list, judged and reduced to
                          the means of Delta_gap and R_anchor over the lists
    anchor_list_values    Eq. 12, 2 and 15 of U anchor lists in one batched call per list
                          length

Axis legend (docs/CONVENTIONS.md): U held-out anchor lists (of this module alone), A anchor
responses, M items.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from drubric_jax.evaluator.rubric_generator import RubricInput
from drubric_jax.rl import rewards
from drubric_jax.rounds.context import Context, Timer
from drubric_jax.rounds.judging import fit_items, verify
from drubric_jax.rounds.process_items import gather_items, own_items
from drubric_jax.types import Role


def anchor_list_values(verdicts, weights, item_mask, list_valid,
                       gold_ranks) -> tuple[np.ndarray, np.ndarray]:
    """Delta_gap (Eq. 2) and R_anchor (Eq. 15, the METHOD 11 floor for an invalid list) of
    U anchor lists, each scored by Eq. 12 with its own rubric list.

    The lists are ragged; those of one length A go through the (batch-polymorphic) formulas
    of `rl.rewards` together, one call per distinct length. No padding enters a sum, and a
    row of a batched call runs the same operations on the same values as a call on that
    list alone, so the values equal a per-list loop's bit for bit
    (`tests/test_phases.py::test_anchor_list_values_equal_the_per_list_loop`).

    Args:
        verdicts: U arrays float32[A_u, M], the verdicts of list u's items on its A_u
            anchor responses (best first).
        weights: int32[U, M]; item_mask: bool[U, M]; list_valid: bool[U], each list's rubric.
        gold_ranks: U int sequences of length A_u (smaller is better, equal is tied).

    Returns:
        (delta_gap float32[U], r_anchor float32[U]).
    """
    u = len(verdicts)
    gap, r_anchor = np.zeros(u, np.float32), np.zeros(u, np.float32)
    lengths = np.array([len(g) for g in gold_ranks], int)
    for a in np.unique(lengths):
        rows = np.flatnonzero(lengths == a)
        scores, _ = rewards.rubric_scores(np.stack([verdicts[i] for i in rows]),
                                          weights[rows], item_mask[rows])    # [U_a, A]
        gold = jnp.asarray(np.array([gold_ranks[i] for i in rows]))
        gap[rows] = np.asarray(rewards.delta_gap(scores, gold)[0])
        r_anchor[rows] = np.asarray(rewards.anchor_reward_or_floor(
            scores, gold, jnp.ones(scores.shape, bool), list_valid[rows]))
    return gap, r_anchor


def heldout_metrics(ctx: Context, key, anchors) -> dict:
    """Delta_gap (Eq. 2) and R_anchor (Eq. 15) of the current generator + verifier on the
    held-out anchor lists: one rubric list from (x, C_anchor) per list, decoded at
    config.policy.heldout_temperature (0 = greedy) with a fixed key per round.

    Returns:
        {"delta_gap", "heldout_r_anchor": means over the lists, "heldout_parse_valid_rate",
        "seconds_eval"}; {} without anchors.
    """
    if not anchors:
        return {}
    timer = Timer()
    rb = ctx.generator.generate_batch(
        ctx.roles.rollout_params(Role.GENERATOR, ctx.mesh), key,
        # The anchor list itself is the response set C shown to the generator (nothing sampled).
        [RubricInput(a.prompt, tuple(a.responses), tuple(a.history)) for a in anchors],
        num_lists=1, temperature=ctx.settings.policy.heldout_temperature,
        static=ctx.settings.variant == "static")
    m = rb.weights.shape[-1]
    # Each process judges its own anchor lists, in one call (a collective: the same number
    # of calls on every process); the means are over all of them.
    mine = own_items(len(anchors))
    rows = [(i, y) for i in mine for y in anchors[i].responses]
    v_all = fit_items(verify(ctx, [anchors[i].prompt for i, _ in rows],
                             [list(anchors[i].history) for i, _ in rows], [y for _, y in rows],
                             [rb.texts[i][0] for i, _ in rows], timer, own=True), m)
    starts = np.cumsum([0] + [len(anchors[i].responses) for i in mine])   # list u's rows
    gaps, r_anchor = anchor_list_values(
        [v_all[s0:s1] for s0, s1 in zip(starts[:-1], starts[1:])], rb.weights[mine, 0],
        rb.item_mask[mine, 0], rb.list_valid[mine, 0], [anchors[i].gold_ranks for i in mine])
    gaps, r_anchor = (gather_items(x.astype(np.float64)) for x in (gaps, r_anchor))
    return {"delta_gap": float(np.mean(gaps)), "heldout_r_anchor": float(np.mean(r_anchor)),
            "heldout_parse_valid_rate": float(np.mean(rb.list_valid)),
            "seconds_eval": sum(timer.seconds.values())}
