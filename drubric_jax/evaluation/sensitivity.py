"""Sensitivity to lambda (Eq. 24-25) and K in the checks world: the summary, table and
one-sentence verdict of `experiments.sensitivity` (issue 32, question 4; METHOD 13).

Each setting is one round of the co-evolution loop from G_0 and P_0 with one override
(configs/sensitivity.py `SETTINGS`). Per setting, from the files its run left:
    generator  `<setting>/heldout_generator.json`: the trained generator's lists on the
               held-out anchor lists (`evaluation.ablation.heldout_per_list`), summarized by
               `evaluation.ablation.summarize` against the baseline setting (paired: one
               rubric-sampling key for every setting)
    policy     `<setting>/heldout.json`: the trained policy's greedy answers to the held-out
               prompts and their gold scores, paired against P_0's (`p0_heldout.json`) and
               against the baseline setting's, bootstrap CIs over prompts
               (`evaluation.checks_policy.paired_difference`)

Axis legend (docs/CONVENTIONS.md): U held-out anchor lists or prompts, Bt bootstrap
replicates.
"""
from __future__ import annotations

import json
import os
from typing import Sequence

import numpy as np

GENERATOR_FILE = "heldout_generator.json"  # in each setting's run directory


def summarize(workdir: str, settings: Sequence[str], baseline: str, n_boot: int,
              seed: int) -> dict:
    """Recomputes every statistic of the sensitivity experiment from its files.

    Args:
        workdir: the experiment's directory (`<setting>/` runs and `p0_heldout.json`).
        settings: the settings to report, in table order.
        baseline: the setting the paired differences are taken against (the paper's
            lambda, "lam1"); must be among `settings`.
        n_boot: Bt bootstrap replicates; seed: their numpy seed.

    Returns:
        {"settings", "baseline", "generator": `ablation.summarize` output over the
        settings, "gold": {setting: {"vs_p0", "vs_<baseline>": paired_difference}}}.

    Raises:
        ValueError: `baseline` is not among `settings`.
        FileNotFoundError: a setting's evaluation file is missing (names the path).
    """
    from drubric_jax.evaluation import ablation
    from drubric_jax.evaluation import checks_policy as cp

    settings = list(settings)
    if baseline not in settings:
        raise ValueError(f"baseline setting {baseline!r} is not among {settings}")

    def need(path):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: missing (run experiments.sensitivity on "
                                    f"{workdir} again; it resumes)")
        return path

    per = ablation.load_heldout(workdir, settings, GENERATOR_FILE)
    generator = ablation.summarize(per, baseline, [], n_boot, seed)

    def gold(path):
        with open(need(path), encoding="utf-8") as f:
            return json.load(f)["gold"]

    p0 = gold(os.path.join(workdir, cp.P0_FILE))
    after = {n: gold(os.path.join(workdir, n, cp.HELDOUT_FILE)) for n in settings}
    golds = {n: {"vs_p0": cp.paired_difference(after[n], p0, n_boot, seed),
                 f"vs_{baseline}": cp.paired_difference(after[n], after[baseline], n_boot,
                                                        seed)} for n in settings}
    return {"settings": settings, "baseline": baseline, "generator": generator,
            "gold": golds}


def _ci(x: dict, key: str = "mean", sign: bool = False) -> str:
    f = "{:+.3f}" if sign else "{:.3f}"
    lo, hi = x["ci"]
    return f"{f.format(x[key])} [{f.format(lo)}, {f.format(hi)}]"


def verdict(summary: dict) -> str:
    """One sentence: which settings' trained generators recovered constraints (held-out
    constraint F1 CI above 0) and which settings' policies moved the held-out gold score
    beyond chance, against P_0 and against the baseline (what was shown, what was not)."""
    g, base = summary["generator"]["generators"], summary["baseline"]
    f1 = [n for n in summary["settings"] if g[n]["constraint_f1"]["ci"][0] > 0]
    moved = {k: [n for n in summary["settings"]
                 if not summary["gold"][n][k]["ci"][0] <= 0 <= summary["gold"][n][k]["ci"][1]]
             for k in ("vs_p0", f"vs_{base}")}
    f1_s = (f"held-out constraint F1 above 0 for {', '.join(f1)}" if f1 else
            "no setting's generator recovered a held-out constraint beyond chance "
            "(every constraint-F1 CI reaches 0)")
    p0_s = (f"the held-out gold score moved beyond chance from P_0 for {', '.join(moved['vs_p0'])}"
            if moved["vs_p0"] else "no setting moved the held-out gold score beyond chance "
            "from P_0")
    b_s = (f"and differed from {base} for {', '.join(moved['vs_' + base])}"
           if moved["vs_" + base] else f"and none differed from {base} beyond chance")
    return (f"Shown (one seed a setting): {f1_s}; {p0_s}, {b_s}. A difference inside its CI "
            "is not shown either way.")


def markdown(summary: dict, command: str, wall_s: dict, overrides: dict, seed: int) -> str:
    """results.md: per setting, the trained generator's held-out constraint F1 (with
    arguments and on check ids), Delta_gap, R_anchor and pairwise accuracy, and the trained
    policy's held-out gold score against P_0 and against the baseline setting."""
    g, base = summary["generator"], summary["baseline"]
    lines = ["# Sensitivity: lambda (Eq. 24-25) and K, checks world", "", verdict(summary), "",
             f"- command: `{command}`", f"- seed {seed}, one run a setting"]
    lines += [f"- wall time of `{k}`: {v / 60:.1f} min" for k, v in wall_s.items()]
    lines += ["", "## The trained generator on the held-out anchor lists", "",
              "| setting | overrides | constraint F1 [95% CI] | F1 on check ids | Delta_gap | "
              "R_anchor | strict pairwise acc. | tie rate |", "|---|---|---|---|---|---|---|---|"]
    for n in summary["settings"]:
        x = g["generators"][n]
        lines.append(f"| {n} | {overrides.get(n, '')} | {_ci(x['constraint_f1'])} | "
                     f"{_ci(x['constraint_f1_check_id'])} | {_ci(x['delta_gap'])} | "
                     f"{_ci(x['r_anchor'])} | {_ci(x['strict_acc'])} | "
                     f"{x['tie_rate']:.2f} |")
    others = [n for n in summary["settings"] if n != base]
    if others:
        lines += ["", f"Paired differences against {base} (same lists, same sampling key):", "",
                  "| setting | constraint F1 | Delta_gap | R_anchor |", "|---|---|---|---|"]
        for n in others:
            d = g["vs_baseline"][n]
            lines.append(f"| {n} - {base} | {_ci(d['constraint_f1'], 'diff', True)} | "
                         f"{_ci(d['delta_gap'], 'diff', True)} | "
                         f"{_ci(d['r_anchor'], 'diff', True)} |")
    lines += ["", "## The trained policy on the held-out prompts (gold score, greedy)", "",
              f"| setting | P_0 | after | after - P_0 [95% CI] | after - {base} [95% CI] |",
              "|---|---|---|---|---|"]
    for n in summary["settings"]:
        gd = summary["gold"][n]
        lines.append(f"| {n} | {gd['vs_p0']['before']:.3f} | {gd['vs_p0']['after']:.3f} | "
                     f"{_ci(gd['vs_p0'], 'difference', True)} | "
                     f"{_ci(gd['vs_' + base], 'difference', True)} |")
    lines += ["", f"Generator columns: {g['n_lists']} held-out anchor lists; percentile "
              "bootstrap CIs over lists. Gold columns: paired bootstrap CIs over the "
              f"{summary['gold'][base]['vs_p0']['prompts']} held-out prompts.", ""]
    return "\n".join(lines)
