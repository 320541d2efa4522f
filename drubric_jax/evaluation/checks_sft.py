"""The report of the generator's warm start G_sft (checks world III, METHOD 13): its
constraint recovery, how well its lists name the true checks of prompts it never trained
on (world v2's dev split, where its recipe is chosen; issue 53).

`rounds.sft_stage.heldout_recovery` gives, per evaluated row (a prompt x never paired, K of
P_0's responses, its true checks T(x)), precision, recall and F1 of one list with
arguments matched (the check id and every argument equal), F1 on check ids alone, whether
the row was recovered exactly (F1 = 1) and whether the list was valid (an invalid list
scores 0, METHOD 11). Here: the mean over rows with a percentile-bootstrap 95% CI over
rows (`evaluation.intervals`), and the table.

Axis legend (docs/CONVENTIONS.md): U evaluated rows, M items, Bt bootstrap replicates.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from drubric_jax.evaluation.intervals import percentile_interval, resample_weights
from drubric_jax.rounds.sft_stage import STATS


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


def summaries(evals: Sequence[dict], n_boot: int, seed: int) -> list:
    """The evaluations of `rounds.sft_stage.run_sft` (recovery rows) with their "summary"
    (`summarize` of each row's per-row values), in step order; the per-row lists dropped."""
    return [{"step": e["step"], "epoch": e["epoch"], "train_nll": e.get("train_nll"),
             "seconds": e.get("seconds"), "summary": summarize(
                 {**e["per_row"], "ids": e["ids"]}, n_boot, seed)}
            for e in sorted(evals, key=lambda e: e["step"])]


def markdown(evals: Sequence[dict], command: str, setup: str, wall: dict) -> str:
    """The G_sft table: one line per evaluation (step 0, then after each epoch) of
    `summaries`."""
    def ci(s):
        return f"{s['mean']:.3f} [{s['ci'][0]:.3f}, {s['ci'][1]:.3f}]"

    lines = ["# G_sft: constraint recovery of the generator's warm start", "",
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
    lines += ["", f"Rows: {evals[0]['summary']['rows'] if evals else 0} prompts never paired "
              "(the file the setup names: the dev split's anchor rows in world v2's splits); "
              "95% CIs are percentile bootstrap over them.", "",
              "Wall time (s): " + ", ".join(f"{k} {v:.0f}" for k, v in wall.items()), ""]
    return "\n".join(lines)
