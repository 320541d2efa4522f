"""The verifier's verdicts for a phase: (prompt, response, rubric list) triples in, the
verdict grid out (METHOD 11, 12).

    verify                verdicts float32[R, M_max] of R triples, in the config's mode
    verify_lists_on_sets  every response of each input's set on each of its G lists, from
                          one verifier call: float32[B, G, J, M]
    fit_items             verdicts cut or zero-padded to M items

Axis legend (docs/CONVENTIONS.md): B inputs, G rubric lists per input, M items, R rows
(triples); and, in this module alone, J responses judged per input (the `sets` argument of
a call: the response set C, an anchor list, or both joined; padded to the longest).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from drubric_jax.evaluator.verdicts import verdicts_from_p_yes
from drubric_jax.rounds.context import Context, Timer


def verify(ctx: Context, prompts, histories, responses, item_lists, timer: Timer,
           own: bool = False, stats: Optional[dict] = None) -> np.ndarray:
    """Verdicts float32[R, M_max] for R (prompt, response, item list) triples, in the
    config's mode (`config.verifier.verdict`: hard 0/1 or soft P(yes); METHOD 11, 12) after
    its calibration (`config.verifier.calibration`). own=True: the triples are this
    process's own rows (`Verifier.p_yes(process_rows=True)`; every process calls).
    stats: optional dict of the verifier's counters (`Verifier.p_yes(stats=)`; a
    mixture-of-experts verifier's router load, `step_metrics.verifier_moe_metrics`)."""
    ver = ctx.settings.verifier
    with timer("verification"):
        p_yes = ctx.verifier.p_yes(ctx.roles.params("verifier"), prompts, responses,
                                   item_lists, history=histories,
                                   calibration=ver.calibration, process_rows=own,
                                   stats=stats)
    return verdicts_from_p_yes(p_yes, ver.verdict)


def fit_items(verdicts: np.ndarray, m: int) -> np.ndarray:
    """Verdicts [R, M_v] cut or zero-padded to M = m items."""
    if verdicts.shape[1] >= m:
        return verdicts[:, :m]
    return np.pad(verdicts, ((0, 0), (0, m - verdicts.shape[1])))


def verify_lists_on_sets(ctx: Context, rb, prompts, histories, sets, timer: Timer,
                         inputs=None, stats: Optional[dict] = None
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Verdicts of every response of each input's set on each of its G rubric lists, from
    ONE verifier call: a response is judged on the concatenation of its input's G lists
    (one shared prefix per response, `Verifier.p_yes`).

    Args:
        ctx: the phase context (its verifier and verifier settings, `verify`).
        rb: the inputs' `RubricBatch` (weights int32[B, G, M], texts B x G x M strings).
        prompts, histories: B prompts and history lists.
        sets: B lists of responses, ragged (J_b responses for input b).
        timer: gets the verifier's seconds under "verification".
        inputs: None (all B inputs), or int[B_p] this process's own inputs
            (`process_items.own_items`; every process calls, each judging its own inputs).
        stats: optional dict of the verifier's counters (`verify`).

    Returns:
        (verdicts float32[B', G, J, M], response_mask bool[B', J]) for the B' = B or B_p
        inputs, J = max_b J_b over all B; verdicts are 0 at padded responses and items.
    """
    _, g, m = rb.weights.shape
    sizes = np.array([len(s) for s in sets])
    j_max = int(sizes.max())
    idx = np.arange(len(sets)) if inputs is None else np.asarray(inputs, int)
    b = len(idx)
    # Query rows are the real cells of a [B', J] grid.
    real = np.arange(j_max)[None, :] < sizes[idx][:, None]                  # [B', J]
    flat_items = [[t for lst in rb.texts[i] for t in lst] for i in idx]
    qb, qj = np.nonzero(real)  # input (position in idx) and response j of each query row
    v = verify(ctx, [prompts[idx[i]] for i in qb], [histories[idx[i]] for i in qb],
               [sets[idx[i]][j] for i, j in zip(qb, qj)], [flat_items[i] for i in qb], timer,
               own=inputs is not None, stats=stats)
    v = fit_items(v, g * m)
    grid = np.zeros((b, j_max, g * m), np.float32)
    grid[qb, qj, :v.shape[1]] = v
    return grid.reshape(b, j_max, g, m).transpose(0, 2, 1, 3), real
