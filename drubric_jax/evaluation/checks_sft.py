"""Held-out constraint recovery of a generator of checks (checks world III, METHOD 13): how
well its lists name the true checks of prompts it never trained on, the measure of the
warm start G_sft.

For each held-out anchor row (a held-out prompt x with K responses of P_0, its true checks
T(x)), the generator writes one list per row (greedy at temperature 0, else sampled), and
`checks.recovery.constraint_prf` compares its kept items with T(x): precision, recall and
F1 with arguments matched (the check id and every argument equal), and F1 on check ids
alone. Reported: the mean over rows with a percentile-bootstrap 95% CI over rows
(`evaluation.intervals`), the fraction of valid lists (an invalid list scores 0,
METHOD 11) and the fraction of rows recovered exactly (F1 = 1).

Axis legend (docs/CONVENTIONS.md): U held-out rows, M items, Bt bootstrap replicates.
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from drubric_jax.evaluation.intervals import percentile_interval, resample_weights

STATS = ("constraint_f1", "constraint_f1_check_id", "constraint_precision",
         "constraint_recall", "exact", "valid")
"""Per-row values `heldout_recovery` returns, in report order."""


def heldout_recovery(generator, params, rows: Sequence, key: jax.Array,
                     temperature: float = 0.0) -> dict:
    """One list per held-out row from `generator` and its recovery of the true checks.

    Args:
        generator: an `evaluator.rubric_generator.RubricGenerator` of checks (its fmt is the
            checks format; `rows_per_call` bounds the rows decoded at once).
        params: the generator's params for that generator's cfg (adapters attached for a
            LoRA trainee).
        rows: U records with `.prompt`, `.responses`, `.history` and `.meta["checks"]` (a
            held-out anchors file of `experiments.make_checks_anchors`).
        key: PRNG key of the response orders (and of the samples when temperature > 0).
        temperature: 0 = greedy.

    Returns:
        {stat: float64[U] for stat in STATS, "ids": U row ids, "lists": U lists of
        (check, args) items kept}; "exact" is 1.0 where F1 = 1, "valid" where the list
        parsed with >= 1 kept item.

    Raises:
        ValueError: no rows, or a row without valid true checks (names it).
    """
    from drubric_jax.checks.gold import true_checks_of
    from drubric_jax.evaluation.ablation import constraint_per_anchor
    from drubric_jax.evaluator.check_rubrics import item_of_text
    from drubric_jax.evaluator.rubric_generator import RubricInput

    if not rows:
        raise ValueError("no held-out rows to evaluate")
    truth = [true_checks_of(r.meta, f"held-out row {r.id!r}") for r in rows]
    rb = generator.generate_batch(
        params, key, [RubricInput(r.prompt, tuple(r.responses), tuple(r.history or ()))
                      for r in rows], num_lists=1, temperature=float(temperature))
    stats = constraint_per_anchor(rb.texts, np.asarray(rb.item_mask), truth)
    valid = np.asarray(rb.list_valid, bool)[:, 0]
    lists = [[item_of_text(t) for t, on in zip(rb.texts[u][0], rb.item_mask[u, 0]) if on]
             for u in range(len(rows))]
    return {**stats, "exact": (stats["constraint_f1"] == 1.0).astype(np.float64),
            "valid": valid.astype(np.float64), "ids": [r.id for r in rows], "lists": lists}


def summarize(per_row: dict, n_boot: int, seed: int, level: float = 0.95) -> dict:
    """{stat: {"mean", "ci": [lo, hi]}} of each of STATS over the rows (percentile
    bootstrap over rows, `n_boot` replicates from `seed`), and "rows": U."""
    u = len(per_row["ids"])
    w = resample_weights(u, int(n_boot), int(seed))
    out = {"rows": u}
    for k in STATS:
        x = np.asarray(per_row[k], np.float64)
        out[k] = {"mean": float(x.mean()), "ci": percentile_interval(w @ x / u, level)}
    return out


def markdown(evals: Sequence[dict], command: str, setup: str, wall: dict) -> str:
    """The G_sft table: one line per evaluation (step 0, then after each epoch)."""
    def ci(s):
        return f"{s['mean']:.3f} [{s['ci'][0]:.3f}, {s['ci'][1]:.3f}]"

    lines = ["# G_sft: held-out constraint recovery of the generator's warm start", "",
             "A deviation for scale, not part of the paper's method: this supervised stage",
             "stands in for the zero-shot competence of the paper's 8B generator.", "",
             setup, "", "    " + command, "",
             "| step | epoch | train NLL (last epoch) | F1 (check + args) | F1 (check ids) | "
             "precision | recall | exact | valid lists |", "|---|---|---|---|---|---|---|---|---|"]
    for e in evals:
        s = e["summary"]
        nll = "-" if e.get("train_nll") is None else f"{e['train_nll']:.3f}"
        lines.append(f"| {e['step']} | {e['epoch']} | {nll} | {ci(s['constraint_f1'])} | "
                     f"{ci(s['constraint_f1_check_id'])} | {ci(s['constraint_precision'])} | "
                     f"{ci(s['constraint_recall'])} | {s['exact']['mean']:.3f} | "
                     f"{s['valid']['mean']:.3f} |")
    lines += ["", f"Rows: {evals[0]['summary']['rows'] if evals else 0} held-out prompts; "
              "95% CIs are percentile bootstrap over them.", "",
              "Wall time (s): " + ", ".join(f"{k} {v:.0f}" for k, v in wall.items()), ""]
    return "\n".join(lines)
