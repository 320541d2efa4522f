"""The report of the policy-reward experiment in the checks world (`evaluation.checks_policy`
computes the numbers; this module writes them): results.md's tables and verdict, and the
training-curve plot.

    markdown     results.md: the verdict, the held-out tables (greedy; sampled in world v2),
                 the held-out gold curve, the pass rate per check, the spread across seeds
                 and the pooled figures (two-stage bootstrap, METHOD 15, with the smallest
                 detectable difference beside a null), arm against arm, the runs'
                 bookkeeping, the settings that differ from the gold arm's, the training
                 batches' first and last steps
    verdict      one sentence per arm: above P_0 in every seed's CI, in none, or in some
    plot         proxy and gold training curves per arm (matplotlib Agg)
"""
from __future__ import annotations

import json

import numpy as np

from drubric_jax.evaluation.intervals import two_stage_name

POOLED = two_stage_name("prompts")
# What a pooled figure is, under each table that has one.
POOLED_NOTE = (f"Pooled: the mean over the seeds of each seed's mean over the held-out prompts; "
               f"95% CI by a {POOLED} (METHOD 15: one replicate draws the seeds with "
               "replacement, then the held-out prompts, a prompt drawn once for all the drawn "
               "seeds since every seed answers the same prompts). With 3 seeds it is coarse: "
               "the per-seed rows stand beside it. \"detectable >= x\" beside a CI that holds "
               "0: the smallest true difference this design detects with 80% power at "
               "two-sided 5% (2.8 standard errors of the same bootstrap).")


def _ci(d: dict) -> str:
    lo, hi = d["ci"]
    return f"{d['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def _pooled(d: dict) -> str:
    """A pooled difference [CI], and beside a CI that holds 0 the smallest detectable
    difference (`intervals.minimal_detectable`)."""
    text = _ci(d)
    if d.get("zero_inside_ci") and np.isfinite(d.get("minimal_detectable", np.nan)):
        text += f"; detectable >= {d['minimal_detectable']:.3f}"
    return text


def markdown(summary: dict, command: str, wall_s: dict, setup: str) -> str:
    """results.md of the experiment: what was shown and what was not, the held-out table per
    arm and seed, the spread across seeds, the arm-vs-arm differences and the curves' ends."""
    arms = summary["arms"]
    lines = ["# Does a rubric reward raise the gold score? (checks world, policy GRPO)", ""]
    lines += [verdict(summary), "", f"- command: `{command}`", f"- setup: {setup}"]
    lines += [f"- wall time of `{k}`: {v / 60:.1f} min" for k, v in wall_s.items()]
    p0 = summary["p0"]
    lines += [f"- P_0 (`{p0['model']}`, untrained) on the {p0['prompts']} held-out prompts, "
              f"greedy: mean gold {p0['gold_mean']:.3f} ({p0.get('truncated')} answers cut "
              "at the token budget)", "",
              "## Held-out gold score, each policy after training minus P_0 (paired, 95% CI "
              "over prompts)", "", "| arm (reward) | seed | P_0 | after | after - P_0 [95% CI] |",
              "|---|---|---|---|---|"]
    for arm, a in arms.items():
        for s, v in a["seeds"].items():
            h = v["heldout"]
            lines.append(f"| {arm} | {s} | {h['before']:.3f} | {h['after']:.3f} | {_ci(h)} |")
    if any("heldout_sampled" in v for a in arms.values() for v in a["seeds"].values()):
        lines += ["", "## Held-out gold on samples at the training temperature (each prompt's "
                  "mean over its samples), after - P_0 (paired, 95% CI over prompts)", "",
                  "| arm | seed | P_0 | after | after - P_0 [95% CI] |", "|---|---|---|---|---|"]
        for arm, a in arms.items():
            for s, v in a["seeds"].items():
                if "heldout_sampled" in v:
                    h = v["heldout_sampled"]
                    lines.append(f"| {arm} | {s} | {h['before']:.3f} | {h['after']:.3f} | "
                                 f"{_ci(h)} |")
    lines += curve_table(arms)
    lines += check_table(summary)
    lines += ["", "## Across seeds (held-out after - P_0)", "",
              "| arm | seeds | mean | sd | min | max | pooled greedy [95% CI, "
              f"{POOLED}] | pooled sampled [95% CI, {POOLED}] |",
              "|---|---|---|---|---|---|---|---|"]
    for arm, a in arms.items():
        x = a["across_seeds"]
        pooled = [_pooled(a[k]) if k in a else "-" for k in ("pooled", "pooled_sampled")]
        lines.append(f"| {arm} | {x['seeds']} | {x['mean']:+.3f} | {x['sd']:.3f} | "
                     f"{x['min']:+.3f} | {x['max']:+.3f} | {pooled[0]} | {pooled[1]} |")
    lines += ["", "Mean, sd (ddof 1), min and max: of the seeds' greedy differences. "
              + POOLED_NOTE]
    if any("share_of_gold" in a for a in arms.values()):
        lines += ["", "## Each arm's gain as a share of the gold arm's (greedy, paired; per "
                  f"seed 95% CI over prompts, pooled: {POOLED})", "",
                  "| arm | seed | share of gold's gain [95% CI] | "
                  "replicates with a gold gain > 0 |", "|---|---|---|---|"]
        for arm, a in arms.items():
            for s, d in a.get("share_of_gold", {}).items():
                where = f"pooled over {d['seeds']} ({POOLED})" if s == "pooled" else s
                lines.append(f"| {arm} | {where} | {d['share']:+.2f} [{d['ci'][0]:+.2f}, "
                             f"{d['ci'][1]:+.2f}] | {d['kept']:.2f} |")
        lines += ["", "A share is sum(arm - P_0) / sum(gold - P_0) over the same prompts (pooled: "
                  "each seed weighing 1 / S); where the gold arm's own gain is within chance, "
                  "so is every share."]
    if summary["versus"]:
        lines += ["", "## Arm against arm on the held-out prompts (paired; per seed 95% CI over "
                  f"prompts, pooled: {POOLED})", "", "| difference | seed | value [95% CI] |",
                  "|---|---|---|"]
        for name, per_seed in summary["versus"].items():
            for s, d in per_seed.items():
                if s == "pooled":
                    lines.append(f"| {name} | pooled over {d['seeds']} ({POOLED}) | "
                                 f"{_pooled(d)} |")
                else:
                    lines.append(f"| {name} | {s} | {_ci(d)} |")
        lines += ["", POOLED_NOTE]
    lines += bookkeeping_table(arms)
    lines += settings_section(summary)
    w = summary["window"]
    lines += ["", f"## Training batches: mean of the first and last {w} policy steps", "",
              "| arm | seed | proxy first | proxy last | gold first | gold last |",
              "|---|---|---|---|---|---|"]
    for arm, a in arms.items():
        for s, v in a["seeds"].items():
            lines.append(f"| {arm} | {s} | {v['train_proxy_first']:.3f} | "
                         f"{v['train_proxy_last']:.3f} | {v['train_gold_first']:.3f} | "
                         f"{v['train_gold_last']:.3f} |")
    lines += ["", "Proxy: the reward the policy was trained on (for `gold` it is the gold "
              "score). Training-batch means are over one step's prompts x K responses: noisy, "
              "and on training prompts; the held-out tables are the test.", ""]
    return "\n".join(lines)


# Column heads of the bookkeeping table, and how each figure prints.
_BOOK_COLUMNS = (
    ("steps", "policy steps", "{:.0f}"),
    ("truncated_fraction", "answers cut at the budget (rows in the update)", "{:.3f}"),
    ("rollout_truncated_fraction", "answers cut at the budget (all samples)", "{:.3f}"),
    ("active_rows", "active rows / step", "{:.1f}"),
    ("update_skipped", "skipped updates", "{:.1f}"),
    ("redraws", "redraws", "{:.1f}"),
    ("prompts_drawn", "prompts drawn", "{:.1f}"),
)


def bookkeeping_table(arms: dict) -> list:
    """Markdown lines: each arm's bookkeeping (`checks_policy.bookkeeping`), the mean over
    its seeds, then each seed; '-' where the run did not log the metric."""
    if not any("bookkeeping" in v for a in arms.values() for v in a["seeds"].values()):
        return []

    def cells(b: dict) -> str:
        return " | ".join("-" if b.get(k) is None else f.format(b[k])
                          for k, _, f in _BOOK_COLUMNS)
    lines = ["", "## Bookkeeping of the training runs (policy steps, from each run's "
             "metrics.jsonl)", "",
             "| arm | seed | " + " | ".join(h for _, h, _ in _BOOK_COLUMNS) + " |",
             "|---|---|" + "---|" * len(_BOOK_COLUMNS)]
    for arm, a in arms.items():
        seeds = {s: v["bookkeeping"] for s, v in a["seeds"].items() if "bookkeeping" in v}
        if not seeds:
            continue
        if len(seeds) > 1 and "bookkeeping" in a:
            lines.append(f"| {arm} | mean of {len(seeds)} | {cells(a['bookkeeping'])} |")
        lines += [f"| {arm} | {s} | {cells(b)} |" for s, b in seeds.items()]
    lines += ["", "Cut at the budget: the answers that hit the token budget without a stop, "
              "among the rows that entered the update (a skipped step has none) and among "
              "all the step's samples; active rows: the rows that entered the update, per "
              "step; skipped updates, redraws (fresh batches drawn for all-flat ones) and "
              "prompts drawn (redraws included): totals over the run. '-': the run did not "
              "log it."]
    return lines


def settings_section(summary: dict) -> list:
    """Markdown lines: per arm and seed, the settings that differ from the gold arm's of the
    same seed (`checks_policy.settings_differences`), or why they could not be compared."""
    if "settings" not in summary:
        return []
    lines = ["", "## Settings that differ from the gold arm's (same seed, each run's "
             "settings.json)", ""]
    diffs = summary["settings"]
    if "gold" not in summary["arms"]:
        return lines + ["No gold arm ran: nothing to compare the arms' settings against."]
    if not diffs:
        return lines + ["Only the gold arm ran: nothing to compare."]
    lines += ["| arm | seed | settings that differ (this arm; gold) |", "|---|---|---|"]
    for arm, per_seed in diffs.items():
        for s, d in per_seed.items():
            if "missing" in d:
                text = ("not compared: no " + ", ".join(f"`{p}`" for p in d["missing"]))
            else:
                shown = [f"`{k}` = {_setting(v, 'arm')} ({_setting(v, 'reference')})"
                         for k, v in d["differ"].items()]
                if not d["outside"]:
                    text = "; ".join(shown + ["none outside the reward and the generator"])
                else:
                    text = ("; ".join(shown) + "; outside the reward and the generator: "
                            + ", ".join(f"`{k}`" for k in d["outside"]))
            lines.append(f"| {arm} | {s} | {text} |")
    return lines


def _setting(sides: dict, side: str) -> str:
    """One side's value of a differing setting in a table cell, JSON-written ('|' escaped;
    a side without the field: '(absent)')."""
    if side not in sides:
        return "(absent)"
    return json.dumps(sides[side]).replace("|", "\\|")


def curve_table(arms: dict) -> list:
    """Markdown lines: the held-out gold curve (greedy / sampled) per arm and seed."""
    runs = [(arm, s, v["gold_curve"]) for arm, a in arms.items()
            for s, v in a["seeds"].items() if v.get("gold_curve", {}).get("steps")]
    if not runs:
        return []
    steps = sorted({x for _, _, c in runs for x in c["steps"]})
    n = runs[0][2]["rows"][0]
    lines = ["", f"## Held-out gold against policy step (the first {n} held-out prompts; "
             "greedy / one sample at the training temperature)", "",
             "| arm | seed | " + " | ".join(f"step {x}" for x in steps) + " |",
             "|---|---|" + "---|" * len(steps)]
    for arm, s, c in runs:
        at = {x: f"{g:.3f} / {p:.3f}" for x, g, p in zip(c["steps"], c["greedy"], c["sampled"])}
        lines.append(f"| {arm} | {s} | " + " | ".join(at.get(x, "-") for x in steps) + " |")
    return lines


def check_table(summary: dict) -> list:
    """Markdown lines: each check variant's held-out pass rate, P_0 and each arm's seeds
    (greedy / sampled)."""
    p0 = summary["p0"].get("by_check", {})
    if not p0:
        return []
    cols = [(arm, s, v.get("by_check", {})) for arm, a in summary["arms"].items()
            for s, v in a["seeds"].items()]
    lines = ["", "## Held-out pass rate per check (greedy / sampled)", "",
             "| check | n | P_0 | " + " | ".join(f"{a} s{s}" for a, s, _ in cols) + " |",
             "|---|---|---|" + "---|" * len(cols)]

    def cell(d):
        return "-" if d is None else f"{d['greedy']:.2f} / {d['sampled']:.2f}"
    for label, d in p0.items():
        lines.append(f"| `{label}` | {d['n']} | {cell(d)} | " +
                     " | ".join(cell(b.get(label)) for _, _, b in cols) + " |")
    return lines


def verdict(summary: dict) -> str:
    """One sentence per arm: did its held-out gold score rise above P_0 in every seed's CI,
    in none, or in some (what was shown, and what was not)."""
    parts = []
    for arm, a in summary["arms"].items():
        seeds = a["seeds"].values()
        above = sum(v["heldout"]["ci"][0] > 0 for v in seeds)
        below = sum(v["heldout"]["ci"][1] < 0 for v in seeds)
        n = len(a["seeds"])
        every, cis = (f"in all {n} seeds", "every CI") if n > 1 else ("in its 1 seed", "its CI")
        if above == n:
            s = f"raised the held-out gold score above P_0 {every} (CI above 0)"
        elif below == n:
            s = f"lowered it below P_0 {every} (CI below 0)"
        elif above == 0 and below == 0:
            s = (f"moved it by no more than chance in any of {n} seeds ({cis} holds 0)"
                 if n > 1 else f"moved it by no more than chance {every} ({cis} holds 0)")
        else:
            s = (f"raised it in {above}, lowered it in {below} and left it within chance in "
                 f"{n - above - below} of {n} seeds")
        parts.append(f"`{arm}` {s}")
    return "Shown: " + "; ".join(parts) + "."


def plot(summary: dict, out_png: str) -> None:
    """Proxy and gold curves per policy step, one panel per arm (every seed drawn; matplotlib
    Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = summary["arms"]
    fig, axes = plt.subplots(1, len(arms), figsize=(5 * len(arms), 3.5), squeeze=False)
    for ax, (arm, a) in zip(axes[0], arms.items()):
        for s, v in a["seeds"].items():
            c = v["curves"]
            x = np.arange(1, len(c["gold"]) + 1)
            ax.plot(x, c["proxy"], ls="--", alpha=0.7, label=f"proxy, seed {s}")
            ax.plot(x, c["gold"], alpha=0.9, label=f"gold, seed {s}")
        ax.set_title(arm)
        ax.set_xlabel("policy step")
        ax.set_ylabel("mean over the step's responses")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
