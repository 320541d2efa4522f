"""The generator-objective ablation (Table 3) over several runs (seeds): each run scores
its generators on its own held-out anchor lists (`evaluation.ablation`); here the runs'
values are pooled with the two-stage bootstrap of METHOD 15 (runs drawn, then lists by list
id: a list that several runs drew is one unit, not one per run), and their tables are set
side by side with their spread (`experiments.report` writes `ablation-seeds.md`).

Axis legend (docs/CONVENTIONS.md): S runs, U_s held-out anchor lists of run s, Bt bootstrap
replicates.
"""
from __future__ import annotations

import numpy as np

from drubric_jax.evaluation import ablation
from drubric_jax.evaluation.ablation import ci_text
from drubric_jax.evaluation.intervals import (percentile_interval, ratio, replicate_summary,
                                              two_stage_name, two_stage_point_weights,
                                              two_stage_weights)

POOLED = two_stage_name("lists")


def _common_generators(runs: dict) -> list:
    """The generators every run scored, checked for pooling (module docstring)."""
    if len(runs) < 2:
        raise ValueError(f"pooling needs two or more runs; got {list(runs)}")
    names = [g for g in next(iter(runs.values())) if all(g in r for r in runs.values())]
    if not names:
        raise ValueError(f"no generator was scored in every run: "
                         f"{ {n: sorted(r) for n, r in runs.items()} }")
    lists = {n: r[names[0]]["num_lists"] for n, r in runs.items()}
    if len(set(lists.values())) != 1:
        raise ValueError(f"runs of different lists per anchor list (num_lists): {lists}")
    for n, r in runs.items():
        for g in names:
            if list(r[g]["ids"]) != list(r[names[0]]["ids"]):
                raise ValueError(f"run {n!r}: generator {g!r} was scored on other anchor lists "
                                 f"than {names[0]!r}: paired differences need the same lists")
    return names


def pooled_summary(runs: dict, baseline: str, comparisons, n_boot: int, seed,
                   level: float = 0.95) -> dict:
    """`ablation.summarize` of several runs' held-out lists pooled over the runs, with the
    two-stage bootstrap of METHOD 15 (`intervals.two_stage_weights` with the list ids: S
    runs drawn with replacement, then the distinct list ids once per replicate for all the
    drawn runs; a run's mean is over its own lists).

    A mean metric (delta_gap, r_anchor, constraint F1) is the mean over runs of each run's
    mean over its lists; strict_acc is the ratio of the runs' weighted sums of correct
    and gold-ordered pairs (each run weighing 1 / S). Every generator sees the same
    replicate weights, so a difference is paired within each run.

    Args:
        runs: {run name: {generator: `heldout_per_list` / `ablation.load_heldout` values}},
            the generators of a run scored on the same lists (ids) in the same order.
        baseline, comparisons: as `ablation.summarize`.
        n_boot: Bt replicates; seed: their numpy seed (or Generator); level: the coverage.

    Returns:
        `ablation.summarize`'s dict over the generators every run scored, each difference
        also with "se" and "minimal_detectable" (2.8 se, `intervals.minimal_detectable`),
        plus "n_runs": S, "n_distinct_lists": distinct list ids over the runs, and
        "interval": the bootstrap's name; "n_lists" counts (run, list) pairs.

    Raises:
        ValueError: fewer than two runs, no generator common to all of them, runs of
            different G (num_lists), a run whose generators were scored on different
            lists, or a baseline / comparison naming a generator not in every run.
    """
    names = _common_generators(runs)
    for a, b in [(n, baseline) for n in names] + list(comparisons):
        if a not in names or b not in names:
            raise ValueError(f"unknown generator in ({a!r}, {b!r}); every run has {names}")
    sizes = [len(r[names[0]]["ids"]) for r in runs.values()]
    ids = [i for r in runs.values() for i in r[names[0]]["ids"]]
    flat = {g: {k: np.concatenate([np.asarray(r[g][k], np.float64) for r in runs.values()])
                for k, v in runs[next(iter(runs))][g].items()
                if isinstance(v, np.ndarray) and all(k in r[g] for r in runs.values())}
            for g in names}
    metrics = ablation.metrics_of(flat)
    w = two_stage_weights(sizes, n_boot, seed, ids)                       # [Bt, N]
    w0 = two_stage_point_weights(sizes)                                   # [N]

    def stats(x: dict, weights):
        out = {m: weights @ x[m] for m in metrics if m != "strict_acc"}
        out["strict_acc"] = ratio(weights @ x["correct"], weights @ x["pairs"])
        return out

    reps = {g: stats(flat[g], w) for g in names}
    points = {g: {m: float(v) for m, v in stats(flat[g], w0).items()} for g in names}

    def diff(a, b):
        out = {}
        for m in metrics:
            r = replicate_summary(points[a][m] - points[b][m], reps[a][m] - reps[b][m], level)
            out[m] = {"diff": r["mean"], **{k: r[k] for k in (
                "ci", "zero_inside_ci", "se", "minimal_detectable", "kept")}}
        return out

    generators = {}
    for g in names:
        x = flat[g]
        generators[g] = {m: {"mean": points[g][m], "ci": percentile_interval(reps[g][m], level)}
                         for m in metrics}
        generators[g]["tie_rate"] = float(ratio(np.sum(x["ties"]), np.sum(x["pairs"])))
        generators[g]["valid_rate"] = float(np.sum(x["valid"]) / (
            len(ids) * runs[next(iter(runs))][g]["num_lists"]))
    return {"n_lists": len(ids), "n_distinct_lists": len(set(ids)), "n_runs": len(runs),
            "level": level, "n_bootstrap": n_boot, "baseline": baseline,
            "metrics": list(metrics), "generators": generators,
            "vs_baseline": {g: diff(g, baseline) for g in names if g != baseline},
            "comparisons": {f"{a} - {b}": diff(a, b) for a, b in comparisons},
            "interval": POOLED}


def _pooled_diff_text(d: dict) -> str:
    """A pooled difference [CI]; beside a CI that holds 0 the smallest detectable one."""
    text = ci_text(d, "diff")
    if d.get("zero_inside_ci") and np.isfinite(d.get("minimal_detectable", np.nan)):
        text += f"; detectable >= {d['minimal_detectable']:.3f}"
    return text


def across_seeds(summaries: dict, pooled: dict) -> str:
    """Markdown: the ablation over several runs (seeds).

    Args:
        summaries: {run name: `summarize` output plus "seed"}, one per run.
        pooled: `pooled_summary` of the same runs (two-stage bootstrap: runs, then lists).

    Returns:
        Per generator and metric: each run's mean, the mean and sd (ddof 1) over the runs
        and the pooled mean [95% CI]; then per difference (to the baseline, and full minus
        each ablation) and metric: each run's difference [CI], the spread, how many runs'
        CIs exclude 0, and the pooled difference [CI] (beside a CI that holds 0, the
        smallest detectable difference).

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
    name = pooled.get("interval", POOLED)
    lines = ["# Generator objective ablation across seeds (Table 3)", "",
             f"{len(runs)} runs ({', '.join(f'{n} (seed {seeds[n]})' for n in runs)}); "
             f"pooled: {pooled['n_lists']} held-out anchor lists of the runs "
             f"({pooled.get('n_distinct_lists', pooled['n_lists'])} distinct list ids), "
             f"95% CIs by a {name} (METHOD 15: a replicate draws the runs with replacement, "
             "then the list ids once for all the drawn runs, so a list that several runs "
             "drew is one unit; each run's own lists paired across its generators). A "
             "pooled figure is the mean over the runs of each run's mean over its lists. "
             "Per-run columns: percentile bootstrap over that run's lists. \"detectable >= "
             "x\" beside a pooled CI that holds 0: the smallest true difference this design "
             "detects with 80% power at two-sided 5% (2.8 standard errors of the same "
             "bootstrap).", "",
             "## Each generator", "",
             "| generator | metric | " + " | ".join(runs)
             + f" | mean (sd) over runs | pooled [95% CI, {name}] |",
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
              + " | mean (sd) over runs | CI above / below / holding 0 | "
              f"pooled [95% CI, {name}] |",
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
                         f"{len(ds) - above - below} | "
                         f"{_pooled_diff_text(pooled[block][key][m])} |")
    return "\n".join(lines + [""])
