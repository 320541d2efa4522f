"""Co-evolved vs stale over R rounds, from the runs' own metrics (Figure 2's question in the
checks world, METHOD 5-6 and 13; issue 41, Q3).

`experiments.coevolution` in its "rounds" evaluation runs three stages: `round0/` (round 0
of Algorithm 1: G_0 -> G_1 on P_0's samples, P_0 -> P_1 with G_1), then two copies of it
continued to round R - 1: `coevolved/` (each round r: G_r -> G_{r+1} on P_r's samples,
P_r -> P_{r+1} with G_{r+1}) and `stale/` (the generator kept at G_1: ~P_r -> ~P_{r+1}
with G_1; ~P_1 = P_1). Everything compared is logged while they train:

- the held-out gold curve (`rounds.gold_curve`): each policy's greedy and sampled answers
  to the same held-out prompts (never trained on), scored by their true checks, with the
  per-prompt values: P_0 before round 0, then the policy after each round's last step;
- each policy step's training samples (`rounds.step_metrics.gold_metrics`): per prompt,
  the mean proxy (the Eq. 12 score of the generator the arm trains against) and the mean
  gold score. Their difference is the proxy-minus-gold gap: how far the reward the policy
  sees has come apart from the truth (exploitation).

`summarize` gives means with percentile-bootstrap 95% CIs: the held-out gold differences
are paired over held-out prompts (both arms answer the same prompts); the gap difference
of a round is unpaired (a flat batch is redrawn, so the arms' training prompts can part),
its replicates resampling each arm's prompts independently.

Axis legend (docs/CONVENTIONS.md): U held-out prompts, R rounds, Bt bootstrap replicates.
"""
from __future__ import annotations

import os

import numpy as np

from drubric_jax.evaluation.coevolution import paired_summary, pooled_line, seed_table
from drubric_jax.evaluation.intervals import (percentile_interval, resample_weights,
                                              two_stage_bootstrap, two_stage_unpaired)

STAGES = ("round0", "coevolved", "stale")


def _rows(workdir: str, stage: str) -> list:
    from drubric_jax.rounds.run_logging import read_metrics

    path = os.path.join(workdir, stage, "metrics.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no metrics; run the experiment's stage {stage!r}")
    return read_metrics(path)


def _floats(values) -> list:
    # The metrics writer stores nan as the string "nan" (JSON has no NaN).
    return [float(v) for v in values]


def _gold_points(rows: list, where: str) -> dict:
    """{round: (step, row)} of the held-out gold rows: each round's last one (the policy
    after the round), and under round -1 round 0's step-0 row (P_0)."""
    out: dict = {}
    for r in rows:
        if r.get("kind") != "heldout_gold":
            continue
        if "heldout_gold_greedy_values" not in r:
            raise ValueError(f"{where}: a heldout_gold row without per-prompt values "
                             "(written before they were logged); rerun the stage")
        rnd, step = int(r["round"]), int(r["step"])
        if rnd == 0 and step == 0:
            out[-1] = (step, r)
        elif rnd not in out or step >= out[rnd][0]:
            out[rnd] = (step, r)
    return out


def _train_gap(rows: list, rnd: int) -> list:
    """The proxy-minus-gold gap of every training prompt of round `rnd`'s policy steps, in
    step order (steps that logged no per-prompt values are skipped)."""
    steps = sorted((r for r in rows if r.get("kind") == "train" and r.get("phase") == "policy"
                    and int(r.get("round", -1)) == rnd and "group_proxy" in r),
                   key=lambda r: r["global_step"])
    return [p - g for r in steps
            for p, g in zip(_floats(r["group_proxy"]), _floats(r["group_gold"]))]


def round_values(workdir: str) -> dict:
    """Per-prompt values of every policy state and round, from the stages' metrics.

    Returns:
        {"rounds": R, "heldout_rows": U,
         "gold_greedy" / "gold_sampled": {"P0", "P1", ..., "PR", "~P2", ..., "~PR": float[U]},
         "train_gap": {"round0": [...], "coevolved r": [...], "stale r": [...] for r in
                       1..R-1}: each training prompt's proxy minus gold}.

    Raises:
        FileNotFoundError: a stage without metrics.
        ValueError: a stage without a round's gold point, or whose rows lack per-prompt
            values (names the file).
    """
    points, gaps = {}, {}
    first = os.path.join(workdir, "round0", "metrics.jsonl")
    base = _gold_points(_rows(workdir, "round0"), first)
    if -1 not in base or 0 not in base:
        raise ValueError(f"{first}: needs the held-out gold points before and after round 0 "
                         "(config.rounds.heldout_gold_every > 0)")
    points["P0"], points["P1"] = base[-1][1], base[0][1]
    gaps["round0"] = _train_gap(_rows(workdir, "round0"), 0)
    rounds = None
    for arm, mark in (("coevolved", ""), ("stale", "~")):
        rows = _rows(workdir, arm)
        got = _gold_points(rows, os.path.join(workdir, arm, "metrics.jsonl"))
        last = max(got)
        rounds = last + 1 if rounds is None else min(rounds, last + 1)
        for rnd in range(1, last + 1):
            if rnd not in got:
                raise ValueError(f"{os.path.join(workdir, arm, 'metrics.jsonl')}: no held-out "
                                 f"gold point after round {rnd}")
            points[f"{mark}P{rnd + 1}"] = got[rnd][1]
            gaps[f"{arm} {rnd}"] = _train_gap(rows, rnd)
    if rounds is None or rounds < 2:
        raise ValueError(f"{workdir}: the arms ran no round after round 0")
    out = {"rounds": int(rounds), "heldout_rows": int(points["P0"]["heldout_gold_rows"]),
           "train_gap": gaps}
    for kind in ("greedy", "sampled"):
        out[f"gold_{kind}"] = {name: _floats(row[f"heldout_gold_{kind}_values"])
                               for name, row in points.items()}
    return out


def unpaired_difference(a, b, n_boot: int, seed: int, level: float = 0.95) -> dict:
    """mean(a) - mean(b) of two independent samples (nan entries dropped), with a
    percentile-bootstrap CI whose replicates resample a and b independently.

    Returns:
        {"diff", "ci": [lo, hi], "zero_inside_ci", "n": [len(a), len(b)]}; nan when
        either sample is empty.
    """
    a = np.asarray([x for x in a if np.isfinite(x)], np.float64)
    b = np.asarray([x for x in b if np.isfinite(x)], np.float64)
    if a.size == 0 or b.size == 0:
        nan = float("nan")
        return {"diff": nan, "ci": [nan, nan], "zero_inside_ci": True,
                "n": [int(a.size), int(b.size)]}
    ra = resample_weights(a.size, n_boot, seed) @ a / a.size
    rb = resample_weights(b.size, n_boot, seed + 1) @ b / b.size
    lo, hi = percentile_interval(ra - rb, level)
    return {"diff": float(a.mean() - b.mean()), "ci": [lo, hi],
            "zero_inside_ci": bool(lo <= 0.0 <= hi), "n": [int(a.size), int(b.size)]}


def _mean_ci(v, n_boot: int, seed: int) -> dict:
    v = np.asarray([x for x in v if np.isfinite(x)], np.float64)
    if v.size == 0:
        return {"mean": float("nan"), "ci": [float("nan")] * 2, "n": 0}
    reps = resample_weights(v.size, n_boot, seed) @ v / v.size
    return {"mean": float(v.mean()), "ci": percentile_interval(reps), "n": int(v.size)}


def gold_comparisons(rounds: int) -> list:
    """The paired held-out gold comparisons: each later round's co-evolved policy against
    the stale arm's, and the first and last policies of each arm against P_0."""
    pairs = [(f"P{r}", f"~P{r}") for r in range(2, rounds + 1)]
    return pairs + [("P1", "P0"), (f"P{rounds}", "P0"), (f"~P{rounds}", "P0")]


def summarize(values: dict, n_boot: int, seed: int) -> dict:
    """Means and CIs of `round_values`' output.

    Returns:
        {"rounds": R, "heldout_rows": U, "gold_greedy" / "gold_sampled": `paired_summary`
         over the prompts every state scored (`gold_comparisons`), "train_gap": {"means":
         {name: {"mean", "ci", "n"}}, "differences": {"stale r - coevolved r":
         `unpaired_difference`}}}.
    """
    rounds = int(values["rounds"])
    out = {"rounds": rounds, "heldout_rows": values["heldout_rows"]}
    for key in ("gold_greedy", "gold_sampled"):
        arr = {k: np.asarray(v, np.float64) for k, v in values[key].items()}
        keep = np.all([np.isfinite(v) for v in arr.values()], axis=0)
        out[key] = paired_summary({k: v[keep] for k, v in arr.items()},
                                  gold_comparisons(rounds), n_boot, seed)
    gaps = values["train_gap"]
    out["train_gap"] = {
        "means": {k: _mean_ci(v, n_boot, seed) for k, v in gaps.items()},
        "differences": {f"stale {r} - coevolved {r}": unpaired_difference(
            gaps[f"stale {r}"], gaps[f"coevolved {r}"], n_boot, seed)
            for r in range(1, rounds)}}
    return out


def headlines(summary: dict) -> dict:
    """{name: difference} of the experiment's two headline figures: the last round's
    co-evolved minus stale held-out gold (greedy), and its stale minus co-evolved training
    gap (exploitation of the stale generator)."""
    r = summary["rounds"]
    return {f"held-out gold (greedy): P{r} - ~P{r}":
            summary["gold_greedy"]["differences"][f"P{r} - ~P{r}"],
            f"training proxy - gold: stale {r - 1} - coevolved {r - 1}":
            summary["train_gap"]["differences"][f"stale {r - 1} - coevolved {r - 1}"]}


def _ci(x: dict, key: str = "mean", sign: bool = True) -> str:
    f = "{:+.3f}" if sign else "{:.3f}"
    lo, hi = x["ci"]
    return f"{f.format(x[key])} [{f.format(lo)}, {f.format(hi)}]"


def verdict(summary: dict) -> str:
    """One sentence: each headline difference with its CI, shown or not."""
    parts = []
    for name, d in headlines(summary).items():
        lo, hi = d["ci"]
        state = ("not shown: the CI holds 0" if d["zero_inside_ci"] else
                 "shown above 0" if lo > 0 else "shown below 0")
        parts.append(f"{name} is {_ci(d, 'diff')}, {state}")
    return "Shown (one seed; 95% CIs): " + "; ".join(parts) + "."


def markdown(summary: dict, command: str, wall_s: dict, note: str) -> str:
    """results.md of the rounds evaluation: per round, both arms' held-out gold (greedy and
    sampled) and training proxy-minus-gold gap, with the differences."""
    r = summary["rounds"]
    g, s, t = summary["gold_greedy"], summary["gold_sampled"], summary["train_gap"]
    lines = [f"# Co-evolved vs stale evaluator over {r} rounds (Figure 2)", "",
             verdict(summary), "", f"- command: `{command}`", f"- held-out prompts: {note}"]
    lines += [f"- wall time of `{k}`: {v / 60:.1f} min" for k, v in wall_s.items()]
    lines += ["", "## Held-out gold score of each policy (METHOD 13), mean [95% CI]", "",
              "| after round | co-evolved, greedy | stale, greedy | co-evolved - stale, greedy "
              "(paired) | co-evolved, sampled | stale, sampled | co-evolved - stale, sampled |",
              "|---|---|---|---|---|---|---|",
              f"| before (P0) | {_ci(g['means']['P0'], sign=False)} | = | - | "
              f"{_ci(s['means']['P0'], sign=False)} | = | - |",
              f"| 0 (P1) | {_ci(g['means']['P1'], sign=False)} | = | - | "
              f"{_ci(s['means']['P1'], sign=False)} | = | - |"]
    for k in range(2, r + 1):
        key = f"P{k} - ~P{k}"
        lines.append(f"| {k - 1} (P{k}, ~P{k}) | {_ci(g['means'][f'P{k}'], sign=False)} | "
                     f"{_ci(g['means'][f'~P{k}'], sign=False)} | "
                     f"{_ci(g['differences'][key], 'diff')} | "
                     f"{_ci(s['means'][f'P{k}'], sign=False)} | "
                     f"{_ci(s['means'][f'~P{k}'], sign=False)} | "
                     f"{_ci(s['differences'][key], 'diff')} |")
    lines += ["", "| paired difference, greedy | diff [95% CI] | 0 inside the CI |",
              "|---|---|---|"]
    lines += [f"| {k} | {_ci(d, 'diff')} | {'yes' if d['zero_inside_ci'] else 'no'} |"
              for k, d in g["differences"].items()]
    lines += ["", "## Proxy minus gold on each round's training samples, mean [95% CI]", "",
              "The proxy is the Eq. 12 score of the generator the arm trains against (G_r+1 "
              "co-evolved, G_1 stale); per training prompt, the mean over its K samples.", "",
              "| round | co-evolved (prompts) | stale (prompts) | stale - co-evolved "
              "(unpaired) |", "|---|---|---|---|",
              f"| 0 | {_ci(t['means']['round0'])} ({t['means']['round0']['n']}) | = | - |"]
    for k in range(1, r):
        c, st = t["means"][f"coevolved {k}"], t["means"][f"stale {k}"]
        d = t["differences"][f"stale {k} - coevolved {k}"]
        lines.append(f"| {k} | {_ci(c)} ({c['n']}) | {_ci(st)} ({st['n']}) | "
                     f"{_ci(d, 'diff')} |")
    lines += ["", "CIs: percentile bootstrap; held-out differences paired over the same "
              "prompts, training-gap differences unpaired.", ""]
    return "\n".join(lines)


def plot(summary: dict, out_png: str) -> None:
    """Two panels against the round: held-out gold (greedy) of both arms, and the training
    proxy-minus-gold gap of both arms, as means with 95% CI bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = summary["rounds"]
    g, t = summary["gold_greedy"]["means"], summary["train_gap"]["means"]

    def bars(ax, xs, entries, shift, **kw):
        m = np.array([e["mean"] for e in entries])
        err = np.abs(np.array([e["ci"] for e in entries]).T - m[None])
        ax.errorbar(np.asarray(xs) + shift, m, yerr=err, fmt="o-", capsize=4, **kw)

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    xs = list(range(r + 1))  # 0 = P_0, k = the policy after round k - 1
    bars(left, xs, [g["P0"], g["P1"]] + [g[f"P{k}"] for k in range(2, r + 1)], -0.05,
         label="co-evolved")
    bars(left, xs, [g["P0"], g["P1"]] + [g[f"~P{k}"] for k in range(2, r + 1)], 0.05,
         label="stale")
    left.set_xticks(xs, ["P0"] + [f"P{k}" for k in range(1, r + 1)])
    left.set_title("held-out gold, greedy")
    left.legend()
    ks = list(range(r))
    bars(right, ks, [t["round0"]] + [t[f"coevolved {k}"] for k in range(1, r)], -0.05,
         label="co-evolved")
    bars(right, ks, [t["round0"]] + [t[f"stale {k}"] for k in range(1, r)], 0.05,
         label="stale")
    right.set_xticks(ks, [str(k) for k in ks])
    right.set_xlabel("round")
    right.set_title("training samples: proxy - gold")
    right.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def heldout_ids(workdir: str, rows: int):
    """Ids of the `rows` held-out prompts of a run's gold curve: their row positions in the
    file its round-0 stage read (`config.rounds.heldout_gold_path`, whose first rows the
    curve answers: `rounds.gold_curve.load_items`), as "<the file's last two path
    parts>:<row>", so runs that read the same file share them (the same prompts).

    Returns:
        `rows` strings, or None when the stage's config.json is absent (the runs' prompts
        cannot be matched).
    """
    import json

    path = os.path.join(workdir, "round0", "config.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        gold_path = json.load(f).get("rounds", {}).get("heldout_gold_path") or ""
    name = "/".join(os.path.normpath(gold_path).split(os.sep)[-2:])
    return [f"{name}:{i}" for i in range(int(rows))]


def pooled_headlines(values: dict, n_boot: int, seed, ids: dict | None = None) -> dict:
    """The headline differences (`headlines`) pooled over runs (seeds), with the two-stage
    bootstrap of METHOD 15: the held-out gold difference P_R - ~P_R paired per prompt
    (runs drawn, then prompts; by id where `ids` gives them, a prompt the runs share drawn
    once for all), the training gap stale - coevolved of the last round unpaired (runs
    drawn, then each arm's training prompts apart: `intervals.two_stage_unpaired`).

    Args:
        values: {run name: `round_values` output}, two or more runs of the same rounds.
        n_boot: Bt replicates; seed: their numpy seed (or Generator).
        ids: None, or {run name: its U held-out prompt ids (`heldout_ids`) or None};
            prompts are drawn by id only when every run has them.

    Returns:
        {headline name: the two-stage dict with "diff" (its mean)}.

    Raises:
        ValueError: fewer than two runs, or runs of different round counts.
    """
    r = _same_rounds({n: v["rounds"] for n, v in values.items()}, "pooling")
    diffs, kept = [], []
    for v in values.values():
        arr = {k: np.asarray(x, np.float64) for k, x in v["gold_greedy"].items()}
        keep = np.all([np.isfinite(x) for x in arr.values()], axis=0)  # as `summarize`
        diffs.append((arr[f"P{r}"] - arr[f"~P{r}"])[keep])
        kept.append(keep)
    by_id = None
    if ids and all(ids.get(n) for n in values):
        by_id = [[u for u, k in zip(ids[n], keep) if k] for n, keep in zip(values, kept)]
    gold = two_stage_bootstrap(diffs, n_boot, seed, ids=by_id)
    gap = two_stage_unpaired([v["train_gap"][f"stale {r - 1}"] for v in values.values()],
                             [v["train_gap"][f"coevolved {r - 1}"] for v in values.values()],
                             n_boot, seed)
    return {f"held-out gold (greedy): P{r} - ~P{r}": {**gold, "diff": gold["mean"]},
            f"training proxy - gold: stale {r - 1} - coevolved {r - 1}":
            {**gap, "diff": gap["mean"]}}


def _same_rounds(counts: dict, what: str) -> int:
    """The round count {run name: rounds} of two or more runs share.

    Raises:
        ValueError: fewer than two runs, or runs of different round counts.
    """
    if len(counts) < 2:
        raise ValueError(f"{what} needs two or more runs; got {list(counts)}")
    if len(set(counts.values())) != 1:
        raise ValueError(f"runs of different round counts: {counts}")
    return next(iter(counts.values()))


def across_seeds(summaries: dict, pooled: dict | None = None) -> str:
    """Markdown: the headline differences (`headlines`) of several runs, one row per run,
    then their mean, sd (ddof 1) and range, how many runs' CIs exclude 0 and, given
    `pooled` (`pooled_headlines` of the same runs), the difference pooled over the runs.

    Raises:
        ValueError: fewer than two runs, or runs of different round counts.
    """
    rounds = _same_rounds({n: s["rounds"] for n, s in summaries.items()}, "across_seeds")
    lines = [f"# Co-evolved vs stale evaluator across seeds, {rounds} "
             "rounds (Figure 2)", "", f"{len(summaries)} runs.", ""]
    per_run = {n: headlines(s) for n, s in summaries.items()}
    for name in next(iter(per_run.values())):
        lines += [f"## {name}", ""] + seed_table({n: h[name] for n, h in per_run.items()},
                                                 summaries, 3)
        if pooled and name in pooled:
            lines += [pooled_line(pooled[name], len(summaries), 3), ""]
    return "\n".join(lines)

