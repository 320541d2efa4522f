"""Co-evolved vs stale evaluator (Figure 2, METHOD 5-6; issue 13): how well generators
split the samples of policies they were or were not adapted to, and paired comparisons of
policies and generators over the same prompts.

`rdisc_per_prompt`: for each evaluation prompt, K responses of one policy state (sampled
once, `rounds.phases.sample_responses`), then G rubric lists of each generator state on that
same set, every response judged on every list in one verifier call; R_disc (Eq. 13) per
list, averaged over the G lists. Two generators scored on the same samples give a paired
difference.

`paired_summary`: means of per-prompt values with percentile-bootstrap 95% CIs over
prompts, and the paired differences named in `comparisons`.

Axis legend (docs/CONVENTIONS.md): U evaluation prompts, K responses per prompt, G rubric
lists per (x, C), M items, Bt bootstrap replicates.
"""
from __future__ import annotations

import numpy as np

from drubric_jax.rl import rewards
from drubric_jax.evaluation.intervals import (percentile_interval, resample_weights,
                                              two_stage_bootstrap)
from drubric_jax.evaluator.rubric_generator import RubricInput
from drubric_jax.rounds import judging, phases
from drubric_jax.rounds.context import Timer


def policy_samples(ctx, policy_params, key, prompts, histories) -> list:
    """K responses per prompt from `policy_params` (config.policy sampling settings).

    Returns:
        U lists of K response strings.
    """
    k = ctx.settings.policy.num_responses
    _, texts = phases.sample_responses(ctx, key, prompts, histories, k, Timer(),
                                       params=policy_params)
    return [texts[i * k:(i + 1) * k] for i in range(len(prompts))]


def rdisc_per_prompt(ctx, generator_params, key, prompts, histories, sets,
                     num_lists: int, temperature: float) -> dict:
    """R_disc (Eq. 13) of one generator state on fixed response sets.

    Args:
        ctx: a `rounds.context.Context` (its generator, verifier and verdict settings).
        generator_params: the generator state to score.
        key: PRNG key of the rubric sampling (use the same one for every generator).
        prompts, histories: U prompts and history lists; sets: U lists of responses.
        num_lists: G lists per prompt; temperature: their sampling temperature.

    Returns:
        {"r_disc": float64[U] (mean over the G lists; an invalid list scores 0),
        "valid": float64[U] (valid lists of the G), "proxy": float64[U] the mean Eq. 12
        score of the responses over the valid lists (nan where none is valid): the reward
        a policy trained against this generator would see}.
    """
    rb = ctx.generator.generate_batch(
        generator_params, key,
        [RubricInput(p, tuple(c), tuple(h)) for p, c, h in zip(prompts, sets, histories)],
        num_lists=num_lists, temperature=temperature)
    v, real = judging.verify_lists_on_sets(ctx, rb, prompts, histories, sets, Timer())
    r = np.asarray(rewards.discriminability_reward(
        v, rb.weights, rb.item_mask, np.broadcast_to(real[:, None], v.shape[:3])), np.float64)
    scores, valid = (np.asarray(x) for x in rewards.rubric_scores(v, rb.weights, rb.item_mask))
    use = (valid & np.asarray(rb.list_valid))[:, :, None] & np.asarray(real)[:, None, :]
    with np.errstate(invalid="ignore"):
        proxy = (np.where(use, scores, 0.0).sum(axis=(1, 2)) / use.sum(axis=(1, 2)))
    return {"r_disc": r.mean(axis=1),
            "valid": np.asarray(rb.list_valid, np.float64).sum(axis=1),
            "proxy": proxy.astype(np.float64)}


def paired_summary(values: dict, comparisons, n_boot: int, seed: int,
                   level: float = 0.95) -> dict:
    """Means with CIs of per-prompt values, and paired differences.

    Args:
        values: {name: float[U]}, every entry over the same U prompts in the same order.
        comparisons: (a, b) name pairs; a - b is reported.
        n_boot: Bt replicates (prompts resampled); seed: their numpy seed.

    Returns:
        {"n": U, "means": {name: {"mean", "ci"}}, "differences": {"a - b": {"diff", "ci",
        "zero_inside_ci"}}}.

    Raises:
        ValueError: values of different lengths, or a comparison naming an unknown entry.
    """
    sizes = {k: len(v) for k, v in values.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"paired values need the same prompts: sizes {sizes}")
    u = next(iter(sizes.values()))
    w = resample_weights(u, n_boot, seed)
    reps = {k: w @ np.asarray(v, np.float64) / u for k, v in values.items()}
    out = {"n": u, "means": {k: {"mean": float(np.mean(v)),
                                 "ci": percentile_interval(reps[k], level)}
                             for k, v in values.items()}, "differences": {}}
    for a, b in comparisons:
        if a not in values or b not in values:
            raise ValueError(f"unknown entry in ({a!r}, {b!r}); have {list(values)}")
        lo, hi = percentile_interval(reps[a] - reps[b], level)
        out["differences"][f"{a} - {b}"] = {
            "diff": float(np.mean(values[a]) - np.mean(values[b])), "ci": [lo, hi],
            "zero_inside_ci": bool(lo <= 0.0 <= hi)}
    return out


def markdown(summary: dict, command: str, wall_s: dict, eval_note: str) -> str:
    """results.md of the co-evolution experiment: R_disc of each (generator, policy
    samples) pair and the policies' win rates, with CIs and paired differences."""
    def decimals(block) -> int:
        # 3 decimals, more when the block's values are small (R_disc of soft verdicts is
        # ~1e-3 at 135M) so that each mean shows 3 significant digits.
        vals = [abs(v) for x in block["means"].values() for v in (x["mean"], *x["ci"])]
        top = max(vals, default=0.0)
        return 3 if top == 0 else int(min(8, max(3, 2 - np.floor(np.log10(top)))))

    def ci(x, digits, key="mean", sign=False):
        f = "{:+.%df}" % digits if sign else "{:.%df}" % digits
        lo, hi = x["ci"]
        return f"{f.format(x[key])} [{f.format(lo)}, {f.format(hi)}]"

    def cell(name):  # keys are "G1 | P1" (generator | policy samples): no "|" in a table
        return name.replace(" | ", " on ")

    lines = ["# Co-evolved vs stale evaluator (Figure 2)", "", verdict(summary), "",
             f"- command: `{command}`", f"- evaluation prompts: {eval_note}"]
    lines += [f"- wall time of `{k}`: {v / 60:.1f} min" for k, v in wall_s.items()]
    for title, key, what in (
            ("R_disc (Eq. 13) of each generator on each policy's samples", "r_disc",
             "generator on policy samples"),
            ("Win rate against the reference answers (both orders, ties = 1/2)", "win_rate",
             "policy"),
            ("Soft preference over the reference answers (mean of both orders)",
             "preference", "policy"),
            ("Gold score (METHOD 13) of each policy's greedy answers", "gold", "policy"),
            ("Proxy minus gold on each policy's samples: the Eq. 12 score of the generator it "
             "trained against minus the samples' gold score", "gap",
             "generator on policy samples")):
        block = summary.get(key)
        if not block:
            continue
        lines += ["", f"## {title}", "", f"| {what} | mean [95% CI] |", "|---|---|"]
        digits = decimals(block)
        lines += [f"| {cell(k)} | {ci(v, digits)} |" for k, v in block["means"].items()]
        if block["differences"]:
            lines += ["", "| paired difference | diff [95% CI] | 0 inside the CI |",
                      "|---|---|---|"]
            lines += [f"| {cell(k)} | {ci(d, digits, 'diff', True)} | "
                      f"{'yes' if d['zero_inside_ci'] else 'no'} |"
                      for k, d in block["differences"].items()]
    lines += ["", "CIs: percentile bootstrap over evaluation prompts; differences are "
              "paired (same prompts, same samples or answers where the policy is the "
              "same, same rubric-sampling key).", ""]
    return "\n".join(lines)


# The headline differences of the experiment, in the verdict's words.
_HEADLINES = {
    ("gold", "P2 - ~P2"): "the co-evolved policy's gold score minus the stale arm's",
    ("gap", "G1 | ~P2 - G2 | P2"): "the stale generator's proxy-minus-gold gap minus the "
                                   "co-evolved one's (exploitation)",
    ("win_rate", "P2 - ~P2"): "the co-evolved policy's win rate minus the stale arm's",
    ("r_disc", "G2 | P2 - G1 | P2"): "R_disc of the adapted generator minus the stale one's "
                                      "on P2's samples",
}


def verdict(summary: dict) -> str:
    """One sentence: each headline paired difference (`_HEADLINES`, those the summary has)
    with its CI, and whether the CI excludes 0 (shown) or holds it (not shown)."""
    parts = []
    for (block, key), words in _HEADLINES.items():
        d = (summary.get(block) or {}).get("differences", {}).get(key)
        if d is None or not np.isfinite(d["diff"]):
            continue
        lo, hi = d["ci"]
        state = ("not shown: the CI holds 0" if d["zero_inside_ci"] else
                 "shown above 0" if lo > 0 else "shown below 0")
        parts.append(f"{words} is {d['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}], {state}")
    if not parts:
        return "Shown: nothing (no headline difference was evaluated)."
    return "Shown (one seed; CIs over evaluation prompts): " + "; ".join(parts) + "."


def headline_values(values: dict) -> dict:
    """Per-prompt paired differences of each headline (`_HEADLINES`) one run's eval.json
    holds, on the prompts where every entry of its block is finite (as `summarize`).

    Args:
        values: the contents of a run's eval.json ({"ids": U prompt ids, block: {name:
            float[U]}}).

    Returns:
        {(block, "A - B"): {"ids": the kept prompts' ids, "diff": float64[U'] A - B}}.
    """
    out = {}
    for block, key in _HEADLINES:
        entries = values.get(block) or {}
        a, b = key.split(" - ")
        if a not in entries or b not in entries:
            continue
        arr = {k: np.asarray(v, np.float64) for k, v in entries.items()}
        keep = np.all([np.isfinite(v) for v in arr.values()], axis=0)
        out[(block, key)] = {"ids": [i for i, k in zip(values["ids"], keep) if k],
                             "diff": (arr[a] - arr[b])[keep]}
    return out


def pooled_headlines(evals: dict, n_boot: int, seed) -> dict:
    """Each headline difference (`_HEADLINES`) pooled over runs (seeds): the mean over runs
    of each run's mean paired difference, with the two-stage bootstrap of METHOD 15 (runs
    drawn, then prompts by id: a prompt that several runs evaluated is drawn once for all
    of them; `intervals.two_stage_bootstrap`).

    Args:
        evals: {run name: the contents of its eval.json}, two or more runs.
        n_boot: Bt replicates; seed: their numpy seed (or Generator).

    Returns:
        {(block, "A - B"): `intervals.two_stage_bootstrap` output with "diff" (its mean)},
        for the headlines every run has.

    Raises:
        ValueError: fewer than two runs.
    """
    if len(evals) < 2:
        raise ValueError(f"pooling needs two or more runs; got {list(evals)}")
    per_run = [headline_values(v) for v in evals.values()]
    out = {}
    for head in _HEADLINES:
        if not all(head in r for r in per_run):
            continue
        d = two_stage_bootstrap([r[head]["diff"] for r in per_run], n_boot, seed,
                                ids=[r[head]["ids"] for r in per_run])
        out[head] = {**d, "diff": d["mean"]}
    return out


def pooled_line(d: dict, runs: int, digits: int) -> str:
    """One markdown line: a difference pooled over `runs` runs with its two-stage interval
    (named), and beside a CI that holds 0 the smallest detectable difference."""
    f = "{:+.%df}" % digits
    text = (f"Pooled over {runs} runs ({d['interval']}; METHOD 15): {f.format(d['diff'])} "
            f"[{f.format(d['ci'][0])}, {f.format(d['ci'][1])}]")
    if d["zero_inside_ci"] and np.isfinite(d["minimal_detectable"]):
        text += (f"; the CI holds 0, and the smallest difference this design detects (80% "
                 f"power, two-sided 5%) is {d['minimal_detectable']:.{digits}f}")
    return text + "."


def across_seeds(summaries: dict, pooled: dict | None = None) -> str:
    """Markdown: the headline differences (`_HEADLINES`) of several runs of the experiment,
    one row per run (its own CI over prompts), then across runs the mean, the standard
    deviation (ddof 1) and the range of the point differences, how many runs' CIs
    exclude 0 on each side and, given `pooled`, the difference pooled over the runs.

    Args:
        summaries: {run name: `summarize` output plus its "seed"}, two or more runs.
        pooled: `pooled_headlines` of the same runs, or None (no pooled line).

    Raises:
        ValueError: fewer than two runs.
    """
    if len(summaries) < 2:
        raise ValueError(f"across_seeds needs two or more runs; got {list(summaries)}")
    same = len({tuple(s.get("ids", [])) for s in summaries.values()}) == 1
    lines = ["# Co-evolved vs stale evaluator across seeds (Figure 2)", "",
             f"{len(summaries)} runs; evaluation prompts "
             + ("the same in every run." if same else "differ between runs (seeded by "
                                                        "the run's seed)."), ""]
    for (block, key), words in _HEADLINES.items():
        rows = {n: s[block]["differences"][key] for n, s in summaries.items()
                if key in (s.get(block) or {}).get("differences", {})}
        if not rows:
            continue
        lines += [f"## {block}: {key.replace(' | ', ' on ')}", "", f"{words}.", ""]
        lines += seed_table(rows, summaries, 4)
        if pooled and (block, key) in pooled:
            lines += [pooled_line(pooled[(block, key)], len(summaries), 4), ""]
    return "\n".join(lines)


def seed_table(rows: dict, summaries: dict, digits: int) -> list:
    """Markdown lines: one headline difference of several runs, a row per run ({run name:
    {"diff", "ci"}}; its seed from `summaries`), then the mean, sd (ddof 1) and range of
    the point differences and how many runs' CIs exclude 0 on each side."""
    from drubric_jax.evaluation.checks_policy import seed_spread

    f = "{:+.%df}" % digits
    lines = ["| run | seed | diff [95% CI] |", "|---|---|---|"]
    lines += [f"| {n} | {summaries[n].get('seed', '')} | {f.format(d['diff'])} "
              f"[{f.format(d['ci'][0])}, {f.format(d['ci'][1])}] |" for n, d in rows.items()]
    sp = seed_spread([d["diff"] for d in rows.values()])
    above = sum(d["ci"][0] > 0 for d in rows.values())
    below = sum(d["ci"][1] < 0 for d in rows.values())
    return lines + ["", f"Across {sp['seeds']} runs: mean {f.format(sp['mean'])}, sd "
                    f"{sp['sd']:.{digits}f}, range [{f.format(sp['min'])}, "
                    f"{f.format(sp['max'])}]; CI above 0 in {above}, below 0 in {below}, "
                    f"holding 0 in {len(rows) - above - below}.", ""]


def plot(summary: dict, out_png: str) -> None:
    """Figure 2's panels (matplotlib): R_disc of G_1 and G_2 on each policy's samples, and
    each policy's win rate, as means with their 95% CI bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def points(ax, entries, shift=0.0, **kw):  # means with asymmetric CI bars
        means = np.array([x["mean"] for x in entries])
        err = np.abs(np.array([x["ci"] for x in entries]).T - means[None])
        ax.errorbar(np.arange(len(entries)) + shift, means, yerr=err, fmt="o", capsize=4,
                    **kw)

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    r = summary["r_disc"]["means"]
    policies = list(dict.fromkeys(k.split(" | ")[1] for k in r))
    for shift, g in ((-0.1, "G1"), (0.1, "G2")):
        points(left, [r[f"{g} | {p}"] for p in policies], shift, label=g)
    left.set_xticks(np.arange(len(policies)), [f"samples of {p}" for p in policies])
    left.set_title("R_disc (Eq. 13)")
    left.legend()
    key = "gold" if "gold" in summary else "win_rate"
    w = summary[key]["means"]
    points(right, list(w.values()))
    right.set_xticks(np.arange(len(w)), list(w))
    right.set_title("gold score of greedy answers" if key == "gold"
                    else "win rate against the references")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


COMPARISONS = {
    # The adapted generator against the stale one on the same samples, first of the policy
    # it was adapted to (P1), then of the policy trained with it (P2); and the stale
    # generator on the stale arm's policy against the policy it was adapted to.
    "r_disc": [("G2 | P1", "G1 | P1"), ("G2 | P2", "G1 | P2"), ("G1 | ~P2", "G1 | P1")],
    # The co-evolved policy against the stale arm's, and each round against the last.
    "win_rate": [("P2", "~P2"), ("P2", "P1"), ("P1", "P0")],
    "preference": [("P2", "~P2"), ("P2", "P1"), ("P1", "P0")],
}
# The checks world (METHOD 13) replaces the judged win rates by exact gold scores: each
# policy's greedy answers (gold), and on the policies' samples the proxy (the Eq. 12 score
# of the generator each arm trained against) minus the samples' gold: is the stale
# generator exploited more than the co-evolved one?
CHECKS_COMPARISONS = {
    "r_disc": COMPARISONS["r_disc"],
    "gold": [("P2", "~P2"), ("P2", "P1"), ("P1", "P0"), ("~P2", "P0")],
    "gap": [("G1 | ~P2", "G2 | P2")],
}


def _finite_rows(values: dict) -> dict:
    """The entries of one block on the prompts where every entry is finite (a prompt whose
    lists were all invalid has no proxy score; paired statistics need the same prompts)."""
    arr = {k: np.asarray(v, np.float64) for k, v in values.items()}
    keep = np.all([np.isfinite(v) for v in arr.values()], axis=0)
    return {k: v[keep] for k, v in arr.items()}


def summarize(workdir: str, n_boot: int, seed: int) -> dict:
    """Means, CIs and the paired differences of COMPARISONS (CHECKS_COMPARISONS when the
    evaluation has gold scores, the checks world) from `<workdir>/eval.json`."""
    import json
    import os

    with open(os.path.join(workdir, "eval.json")) as f:
        values = json.load(f)
    comparisons = CHECKS_COMPARISONS if "gold" in values else COMPARISONS
    out = {key: paired_summary(_finite_rows(values[key]), pairs, n_boot, seed)
           for key, pairs in comparisons.items()}
    out["ids"] = values["ids"]
    return out


def eval_note(eval_file: str, skipped: int, seed: int, n: int) -> str:
    """Which prompts were evaluated, for the results header (the file named by its last
    two path parts, e.g. alpaca_eval/eval.jsonl: the header reads the same on any
    machine)."""
    import os

    name = "/".join(os.path.normpath(eval_file).split(os.sep)[-2:])
    if not skipped:  # the checks world's held-out prompts: never trained on
        return f"{n} rows of {name} (seed {seed}; ids in eval.json)"
    return f"{n} rows of {name} after its first {skipped} (seed {seed}; ids in eval.json)"
