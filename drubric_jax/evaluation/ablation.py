"""The generator-objective ablation (METHOD 6, Table 3): rubric generators scored on
held-out anchor lists, with paired bootstrap intervals against the zero-shot generator.

`heldout_per_list` samples `num_lists` rubric lists per held-out anchor list (x, C_anchor)
from one generator, has the frozen verifier judge every anchor response on them (one
verifier call, `rounds.judging.verify_lists_on_sets`), scores them with Eq. 12 and reduces each
anchor list to

    delta_gap   Eq. 2, the mean score gap over gold-ordered pairs, averaged over the lists
    r_anchor    Eq. 15 (the METHOD 11 floor for an invalid list), averaged over the lists
    pairs       gold-ordered pairs x lists; correct: those the scores order strictly right
                (a tie is wrong, METHOD 11); ties: those tied; valid: valid lists
    constraint_f1, constraint_f1_check_id, constraint_precision, constraint_recall
                in the checks world only (METHOD 13, `checks.recovery`): how well the
                lists' checks recover the prompt's true checks (arguments equal, or the
                check ids alone), averaged over the lists (an invalid list scores 0)

`summarize` turns the per-list values of several generators into means with percentile
bootstrap 95% CIs over held-out anchor lists. Every generator is scored on the same lists
with the same resample weights and the same sampling key, so a difference between two
generators is paired: its CI comes from the replicate-wise differences.

Axis legend (docs/CONVENTIONS.md): U held-out anchor lists, G rubric lists per anchor list
(num_lists), A anchor responses, M items, Bt bootstrap replicates.
"""
from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np

from drubric_jax.rl import rewards
from drubric_jax.evaluation.intervals import percentile_interval, ratio, resample_weights
from drubric_jax.evaluation.metrics import pairwise_counts
from drubric_jax.evaluator.rubric_generator import RubricInput
from drubric_jax.rounds import judging
from drubric_jax.rounds.context import Timer
from drubric_jax.types import Role

METRICS = ("delta_gap", "r_anchor", "strict_acc")
"""The reported statistics: means over lists of delta_gap and r_anchor, and the pooled
strict pairwise accuracy (correct / pairs)."""
CHECK_METRICS = ("constraint_f1", "constraint_f1_check_id")
"""Reported too when every generator was scored in the checks world (means over lists)."""


def metrics_of(per_generator: dict) -> tuple:
    """METRICS, plus CHECK_METRICS when every generator's values hold them."""
    if all(all(m in p for m in CHECK_METRICS) for p in per_generator.values()):
        return METRICS + CHECK_METRICS
    return METRICS


def constraint_per_anchor(texts, item_mask, true_checks) -> dict:
    """Constraint recovery of each anchor list's G rubric lists of checks (METHOD 13).

    Args:
        texts: U x G lists of M item texts (`RubricBatch.texts`).
        item_mask: bool[U, G, M] the kept items.
        true_checks: U entries, T(x) of each anchor list's prompt.

    Returns:
        {"constraint_precision", "constraint_recall", "constraint_f1",
        "constraint_f1_check_id"}: float64[U], means over the G lists.

    Raises:
        ValueError: an anchor list whose prompt has no true checks (its index).
    """
    from drubric_jax.evaluator.check_rubrics import list_recovery

    out = {k: [] for k in ("constraint_precision", "constraint_recall", "constraint_f1",
                           "constraint_f1_check_id")}
    for u, truth in enumerate(true_checks):
        if not truth:
            raise ValueError(f"held-out anchor list {u}: its prompt has no true checks")
        prf = [list_recovery(lst, item_mask[u][g], truth)[1]
               for g, lst in enumerate(texts[u])]
        for k, v in zip(out, np.mean(np.asarray(prf, np.float64), axis=0)):
            out[k].append(float(v))
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def heldout_per_list(ctx, key, anchors, num_lists: int, temperature: float,
                     static: bool = False) -> dict:
    """Per held-out anchor list statistics of the context's current generator.

    Args:
        ctx: a `rounds.context.Context` (generator params from its roles, verifier, config).
        key: PRNG key of the rubric sampling (the same key for every generator compared).
        anchors: U `AnchorList`s, never used in training (`LoadedData.heldout_anchors`).
        num_lists: G rubric lists per anchor list (AVG@G).
        temperature: generator sampling temperature (0 = greedy; the G lists then differ
            only through the response order shown).
        static: prompt-only lists (the RaR baseline of METHOD 6).

    Returns:
        {"delta_gap", "r_anchor": float64[U] (means over the G lists), "pairs", "correct",
        "ties", "valid": float64[U] (sums over the G lists), "ids": U anchor ids,
        "num_lists": G}; in the checks world also `constraint_per_anchor`'s four arrays
        (true checks: the anchor row's `meta["checks"]`, else the run's prompt row of the
        same text, `Context.true_checks`).

    Raises:
        ValueError: no anchors.
    """
    if not anchors:
        raise ValueError("no held-out anchor lists (config.data.heldout_anchor_rows = 0?)")
    timer = Timer()
    rb = ctx.generator.generate_batch(
        ctx.roles.params(Role.GENERATOR), key,
        # The anchor list is the response set the generator sees (nothing is sampled).
        [RubricInput(a.prompt, tuple(a.responses), tuple(a.history)) for a in anchors],
        num_lists=num_lists, temperature=temperature, static=static)
    v, real = judging.verify_lists_on_sets(ctx, rb, [a.prompt for a in anchors],
                                           [list(a.history) for a in anchors],
                                           [list(a.responses) for a in anchors], timer)
    u, g, a_max, _ = v.shape                                               # [U, G, A, M]
    gold = np.zeros((u, a_max), np.int32)
    for i, a in enumerate(anchors):
        gold[i, :len(a.gold_ranks)] = a.gold_ranks
    gold_g = jnp.broadcast_to(gold[:, None], (u, g, a_max))
    mask_g = jnp.broadcast_to(real[:, None], (u, g, a_max))
    scores, valid = rewards.rubric_scores(v, rb.weights, rb.item_mask)     # [U, G, A]
    gap, _ = rewards.delta_gap(scores, gold_g, mask_g)                     # [U, G]
    r_anchor = rewards.anchor_reward_or_floor(scores, gold_g, mask_g,
                                              np.asarray(valid) & rb.list_valid)
    pairs, ties, correct = (np.asarray(x, np.float64).sum(axis=1)
                            for x in pairwise_counts(scores, gold_g, mask_g))
    out = {"delta_gap": np.asarray(gap, np.float64).mean(axis=1),
           "r_anchor": np.asarray(r_anchor, np.float64).mean(axis=1),
           "pairs": pairs, "correct": correct, "ties": ties,
           "valid": (np.asarray(valid) & rb.list_valid).sum(axis=1).astype(np.float64),
           "ids": [a.id for a in anchors], "num_lists": g}
    if ctx.settings.verifier.kind == "checks":
        truth = [(a.meta or {}).get("checks") or ctx.true_checks.get(a.prompt)
                 for a in anchors]
        out.update(constraint_per_anchor(rb.texts, np.asarray(rb.item_mask).reshape(u, g, -1),
                                         truth))
    return out


def _replicates(per_list: dict, weights: np.ndarray, metrics=METRICS) -> dict:
    """{metric: float64[Bt]} of one generator under resample weights float64[Bt, U]."""
    u = weights.shape[1]
    out = {m: weights @ per_list[m] / u for m in metrics if m != "strict_acc"}
    out["strict_acc"] = ratio(weights @ per_list["correct"], weights @ per_list["pairs"])
    return out


def _point(per_list: dict, metrics=METRICS) -> dict:
    out = {m: float(np.mean(per_list[m])) for m in metrics if m != "strict_acc"}
    out["strict_acc"] = float(ratio(np.sum(per_list["correct"]), np.sum(per_list["pairs"])))
    return out


def summarize(per_generator: dict, baseline: str, comparisons, n_boot: int, seed: int,
              level: float = 0.95) -> dict:
    """Means, CIs and paired differences of generators scored on the same held-out lists.

    Args:
        per_generator: {name: `heldout_per_list` output}, every entry over the same U
            anchor lists in the same order.
        baseline: the name differences are taken against (the zero-shot generator).
        comparisons: (a, b) name pairs whose difference a - b is reported too (e.g.
            ("full", "disc_only")).
        n_boot: Bt replicates; seed: their numpy seed.

    Returns:
        {"n_lists": U, "baseline": baseline, "metrics": the metrics reported (`metrics_of`),
        "generators": {name: {metric: {"mean", "ci"}, "tie_rate",
        "valid_rate"}}, "vs_baseline": {name: {metric: {"diff", "ci", "zero_inside_ci"}}},
        "comparisons": {"a - b": same}}.

    Raises:
        ValueError: generators scored on different anchor lists, or an unknown name.
    """
    names = list(per_generator)
    ids = per_generator[names[0]]["ids"]
    for name in names:
        if per_generator[name]["ids"] != ids:
            raise ValueError(f"generator {name!r} was scored on other anchor lists than "
                             f"{names[0]!r}: paired differences need the same lists")
    for a, b in [(n, baseline) for n in names] + list(comparisons):
        if a not in per_generator or b not in per_generator:
            raise ValueError(f"unknown generator in ({a!r}, {b!r}); have {names}")
    metrics = metrics_of(per_generator)
    weights = resample_weights(len(ids), n_boot, seed)
    reps = {n: _replicates(per_generator[n], weights, metrics) for n in names}
    points = {n: _point(per_generator[n], metrics) for n in names}

    def diff(a, b):
        out = {}
        for m in metrics:
            lo, hi = percentile_interval(reps[a][m] - reps[b][m], level)
            out[m] = {"diff": points[a][m] - points[b][m], "ci": [lo, hi],
                      "zero_inside_ci": bool(lo <= 0.0 <= hi)}
        return out

    generators = {}
    for n in names:
        p = per_generator[n]
        generators[n] = {m: {"mean": points[n][m],
                             "ci": percentile_interval(reps[n][m], level)} for m in metrics}
        generators[n]["tie_rate"] = float(ratio(np.sum(p["ties"]), np.sum(p["pairs"])))
        # Parse-valid rubric lists among the G sampled per anchor list.
        generators[n]["valid_rate"] = float(np.sum(p["valid"]) / (len(ids) * p["num_lists"]))
    return {"n_lists": len(ids), "level": level, "n_bootstrap": n_boot, "baseline": baseline,
            "metrics": list(metrics), "generators": generators,
            "vs_baseline": {n: diff(n, baseline) for n in names if n != baseline},
            "comparisons": {f"{a} - {b}": diff(a, b) for a, b in comparisons}}


def ci_text(x: dict, key: str = "mean") -> str:
    """"mean [lo, hi]"; differences (key "diff") carry their sign."""
    lo, hi = x["ci"]
    f = "{:+.3f}" if key == "diff" else "{:.3f}"
    return f"{f.format(x[key])} [{f.format(lo)}, {f.format(hi)}]"


def review_verdict(summary: dict, full: str = "full",
                   ablations=("disc_only", "anchor_only")) -> str:
    """One sentence answering the review's falsifier: does `full` raise Delta_gap (Eq. 2)
    more than each ablation? "yes" only when every paired CI of full - ablation lies above
    0; a CI holding 0 is stated as inside its CI."""
    parts, above = [], []
    for ab in ablations:
        d = summary["comparisons"].get(f"{full} - {ab}")
        if d is None:
            continue
        lo, hi = d["delta_gap"]["ci"]
        above.append(lo > 0)
        where = "above 0" if lo > 0 else ("below 0" if hi < 0 else "0 inside the CI")
        parts.append(f"{full} - {ab} = {ci_text(d['delta_gap'], 'diff')} ({where})")
    if not parts:
        return "no full-vs-ablation comparison was run"
    answer = "yes" if all(above) else "no (not shown at this size)"
    return (f"Does {full} raise held-out Delta_gap more than the ablations? {answer}: "
            + "; ".join(parts) + ".")


def markdown_table(summary: dict, command: str, wall_s: dict, heldout_note: str) -> str:
    """results.md of the ablation: one row per generator with 95% CIs, the paired
    differences to the baseline, the full-vs-ablation differences and `review_verdict`."""
    level = int(round(100 * summary["level"]))
    checks = [m for m in CHECK_METRICS if m in summary.get("metrics", METRICS)]
    heads = {"constraint_f1": "constraint F1", "constraint_f1_check_id": "constraint F1 (ids)"}
    lines = ["# Generator objective ablation (Table 3)", "", f"- command: `{command}`",
             f"- held-out anchor lists: {summary['n_lists']} ({heldout_note})"]
    lines += [f"- wall time of `{k}`: {v / 60:.1f} min" for k, v in wall_s.items()]
    lines += ["", f"| generator | Delta_gap [{level}% CI] | R_anchor [{level}% CI] | "
              f"strict pairwise acc [{level}% CI] | "
              + "".join(f"{heads[m]} [{level}% CI] | " for m in checks)
              + "tie rate | valid lists |", "|---|---|---|---|" + "---|" * len(checks)
              + "---|---|"]
    for name, g in summary["generators"].items():
        lines.append(f"| {name} | {ci_text(g['delta_gap'])} | {ci_text(g['r_anchor'])} | "
                     f"{ci_text(g['strict_acc'])} | " + "".join(f"{ci_text(g[m])} | " for m in checks)
                     + f"{g['tie_rate']:.2f} | {g['valid_rate']:.2f} |")
    for title, block in (("Paired difference to the baseline", summary["vs_baseline"]),
                         ("Full objective minus each ablation", summary["comparisons"])):
        if not block:
            continue
        shown = METRICS + tuple(checks)
        lines += ["", f"## {title}", "", "| difference | Delta_gap | R_anchor | strict acc | "
                  + "".join(f"{heads[m]} | " for m in checks)
                  + "0 inside the CI (" + " / ".join(["Delta_gap", "R_anchor", "acc"]
                                                      + [heads[m] for m in checks]) + ") |",
                  "|---|---|---|---|" + "---|" * len(checks) + "---|"]
        for name, d in block.items():
            inside = " / ".join("yes" if d[m]["zero_inside_ci"] else "no" for m in shown)
            lines.append(f"| {name} | " + "".join(f"{ci_text(d[m], 'diff')} | " for m in shown)
                         + f"{inside} |")
    lines += ["", review_verdict(summary), "",
              f"CIs: percentile bootstrap over held-out anchor lists ({summary['n_bootstrap']} "
              "replicates); differences are paired (same lists, same replicates, same "
              "rubric-sampling key).", ""]
    return "\n".join(lines)


def plot(summary: dict, out_png: str) -> None:
    """Each generator's three metrics with their CIs, one panel per metric (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["generators"])
    metrics = summary.get("metrics", METRICS)
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.5))
    for ax, m in zip(axes, metrics):
        means = np.array([summary["generators"][n][m]["mean"] for n in names])
        cis = np.array([summary["generators"][n][m]["ci"] for n in names])
        err = np.abs(cis.T - means[None])
        ax.errorbar(np.arange(len(names)), means, yerr=err, fmt="o", capsize=4)
        ax.set_xticks(np.arange(len(names)), names, rotation=20)
        ax.set_title(m)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def load_heldout(workdir: str, names, filename: str = "heldout.json") -> dict:
    """{name: `heldout_per_list`-style values} read from `<workdir>/<name>/<filename>`
    (written by experiments/ablation.py; experiments/sensitivity.py names its file
    `heldout_generator.json`), arrays as float64.

    Raises:
        FileNotFoundError: a generator was not scored (names the file).
    """
    import json
    import os

    out = {}
    for name in names:
        path = os.path.join(workdir, name, filename)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: generator {name!r} has not been scored")
        with open(path) as f:
            rec = json.load(f)
        out[name] = {k: (np.asarray(v, np.float64) if isinstance(v, list) and k != "ids"
                         else v) for k, v in rec.items()}
    return out


def heldout_note(summary: dict) -> str:
    """Which lists were held out, for the results header: the split of the training anchor
    rows, or files of their own (`summary["heldout_paths"]`, `data.heldout_anchor_paths`)."""
    paths = summary.get("heldout_paths") or []
    source = (f"of {', '.join(os.path.basename(p) for p in paths)} (lists of prompts that "
              "never train)" if paths else "of the anchor rows, never trained on")
    return (f"the first {summary['n_lists']} anchor lists of the seeded shuffle (seed "
            f"{summary.get('seed', 0)}) {source}; ids in summary.json")

