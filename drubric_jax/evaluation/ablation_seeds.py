"""The generator-objective ablation (Table 3) over several runs (seeds): each run scores
its generators on its own held-out anchor lists (`evaluation.ablation`); here the runs'
values are pooled into one set of (run, anchor list) units, and their tables are set side
by side with their spread (`experiments.report` writes `ablation-seeds.md`)."""
from __future__ import annotations

import numpy as np

from drubric_jax.evaluation.ablation import ci_text


def pool_runs(runs: dict) -> dict:
    """One `load_heldout`-style dict over the held-out lists of several runs (seeds).

    Every run scores its generators on its own U_r anchor lists; within a run the
    differences are paired. Pooling concatenates the runs' lists, so a list is a (run, anchor
    list) unit (its id prefixed with the run's name) and a bootstrap over the pooled lists
    keeps each difference paired within its run.

    Args:
        runs: {run name: {generator name: `heldout_per_list` / `load_heldout` values}}.

    Returns:
        {generator: the values concatenated over the runs in order}, for the generators
        every run scored.

    Raises:
        ValueError: fewer than two runs, no generator common to all of them, or runs of
            different G (num_lists).
    """
    if len(runs) < 2:
        raise ValueError(f"pooling needs two or more runs; got {list(runs)}")
    names = [g for g in next(iter(runs.values())) if all(g in r for r in runs.values())]
    if not names:
        raise ValueError(f"no generator was scored in every run: "
                         f"{ {n: sorted(r) for n, r in runs.items()} }")
    lists = {n: r[names[0]]["num_lists"] for n, r in runs.items()}
    if len(set(lists.values())) != 1:
        raise ValueError(f"runs of different lists per anchor list (num_lists): {lists}")
    out = {}
    for g in names:
        first = runs[next(iter(runs))][g]
        keys = [k for k, v in first.items() if isinstance(v, np.ndarray)]
        out[g] = {k: np.concatenate([r[g][k] for r in runs.values()]) for k in keys}
        out[g]["ids"] = [f"{n}/{i}" for n, r in runs.items() for i in r[g]["ids"]]
        out[g]["num_lists"] = first["num_lists"]
    return out


def across_seeds(summaries: dict, pooled: dict) -> str:
    """Markdown: the ablation over several runs (seeds).

    Args:
        summaries: {run name: `summarize` output plus "seed"}, one per run.
        pooled: `summarize` of `pool_runs` of the same runs (CIs over the pooled lists).

    Returns:
        Per generator and metric: each run's mean, the mean and sd (ddof 1) over the runs
        and the pooled mean [95% CI]; then per difference (to the baseline, and full minus
        each ablation) and metric: each run's difference [CI], the spread, how many runs'
        CIs exclude 0, and the pooled difference [CI].

    Raises:
        ValueError: fewer than two runs.
    """
    from drubric_jax.evaluation.checks_policy import seed_spread

    if len(summaries) < 2:
        raise ValueError(f"across_seeds needs two or more runs; got {list(summaries)}")
    metrics = list(pooled["metrics"])
    heads = {"delta_gap": "Delta_gap", "r_anchor": "R_anchor", "strict_acc": "strict acc",
             "constraint_f1": "constraint F1", "constraint_f1_check_id": "constraint F1 (ids)"}
    runs = list(summaries)
    seeds = {n: summaries[n].get("seed", "") for n in runs}
    lines = ["# Generator objective ablation across seeds (Table 3)", "",
             f"{len(runs)} runs ({', '.join(f'{n} (seed {seeds[n]})' for n in runs)}); "
             f"pooled: {pooled['n_lists']} held-out anchor lists (each run's own, paired "
             "within a run), percentile bootstrap 95% CIs.", "",
             "## Each generator", "",
             "| generator | metric | " + " | ".join(runs)
             + " | mean (sd) over runs | pooled [95% CI] |",
             "|---|---|" + "---|" * len(runs) + "---|---|"]
    for g, pg in pooled["generators"].items():
        for m in metrics:
            vals = [summaries[n]["generators"][g][m]["mean"] for n in runs
                    if g in summaries[n]["generators"]]
            sp = seed_spread(vals)
            lines.append(f"| {g} | {heads.get(m, m)} | "
                         + " | ".join(f"{v:.3f}" for v in vals)
                         + f" | {sp['mean']:.3f} ({sp['sd']:.3f}) | {ci_text(pg[m])} |")
    lines += ["", "## Paired differences", "",
              "| difference | metric | " + " | ".join(runs)
              + " | mean (sd) over runs | CI above / below / holding 0 | pooled [95% CI] |",
              "|---|---|" + "---|" * len(runs) + "---|---|---|"]
    blocks = ([(f"{n} - {pooled['baseline']}", "vs_baseline", n) for n in pooled["vs_baseline"]]
              + [(c, "comparisons", c) for c in pooled["comparisons"]])
    for label, block, key in blocks:
        per_run = [summaries[n][block][key] for n in runs if key in summaries[n][block]]
        for m in metrics:
            ds = [d[m] for d in per_run]
            sp = seed_spread([d["diff"] for d in ds])
            above = sum(d["ci"][0] > 0 for d in ds)
            below = sum(d["ci"][1] < 0 for d in ds)
            lines.append(f"| {label} | {heads.get(m, m)} | "
                         + " | ".join(ci_text(d, "diff") for d in ds)
                         + f" | {sp['mean']:+.3f} ({sp['sd']:.3f}) | {above} / {below} / "
                         f"{len(ds) - above - below} | {ci_text(pooled[block][key][m], 'diff')} |")
    return "\n".join(lines + [""])
