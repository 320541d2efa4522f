"""results.md and its plot from one or more evaluator-benchmark report.json files.

`results_markdown(reports)`: a header with each run's command, wall time and settings;
per file a table of every method's strict pairwise accuracy, tie rate, accuracy with ties
excluded, and (listwise files) strict top-1 and nDCG, each with its 95% bootstrap CI; the
macro average over files; the paired soft - hard (and calibrated - raw) differences; and
per file a plain statement of which methods are at chance.

At chance: a method whose 95% CI contains the chance value, 0.5 for strict pairwise
accuracy (random scores order a pair right half the time; a predicted tie counts as
wrong, so a tie-heavy method can sit BELOW chance), and the random baseline's mean for
top-1 and nDCG (their chance level depends on K and the gold ties).

`plot(reports, path)`: strict accuracy with CI bars per method and file (matplotlib Agg).
"""
from __future__ import annotations

import math
import os

from drubric_jax.evaluation.aggregate import LISTWISE_METRICS

PAIR_CHANCE = 0.5
_SIDES = {"above": "above chance", "at": "at chance", "below": "below chance",
          "undefined": "undefined"}
HIDDEN_IN_PLOT = ("direct_pairwise_ab", "direct_pairwise_ba")  # their mean is _avg


def _name(path: str) -> str:
    """data file label: the last two path parts without .jsonl."""
    parts = os.path.normpath(path).split(os.sep)[-2:]
    return "/".join(parts)[:-len(".jsonl")] if path.endswith(".jsonl") else "/".join(parts)


def _num(x) -> float:
    """A report number as float (report.json writes nan / inf as strings; None is nan)."""
    return float("nan") if x is None else float(x)


def _cell(entry) -> str:
    m = _num(entry["mean"])
    if math.isnan(m):
        return "-"
    lo, hi = (_num(x) for x in entry.get("ci95", [None, None]))
    return f"{m:.3f}" if math.isnan(lo) else f"{m:.3f} [{lo:.2f}, {hi:.2f}]"


def _table(head, rows) -> list:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _side(entry, chance: float) -> str:
    """"at", "above" or "below": where the CI lies relative to chance."""
    lo, hi = (_num(x) for x in entry["ci95"])
    if math.isnan(lo):
        return "undefined"
    return "above" if lo > chance else ("below" if hi < chance else "at")


def chance_statement(name: str, section: dict) -> str:
    """One line per file: which methods are at, above or below chance (see module doc)."""
    checks = [("strict_acc", "strict pairwise accuracy", PAIR_CHANCE)]
    rnd = section["methods"].get("random")
    if section["listwise"] and rnd is not None:
        checks += [(k, {"top1": "top-1", "ndcg": "nDCG"}[k], _num(rnd[k]["mean"]))
                   for k in LISTWISE_METRICS]
    parts = []
    for key, label, chance in checks:
        groups = {"above": [], "at": [], "below": []}
        for m, e in section["methods"].items():
            if m != "random":
                groups.setdefault(_side(e[key], chance), []).append(m)
        text = "; ".join(f"{_SIDES[side]}: {', '.join(ms)}" for side, ms in groups.items() if ms)
        parts.append(f"{label} (chance {chance:.2f}) - {text}")
    return f"- **{name}** ({section['n_rows']} rows): " + ". ".join(parts) + "."


def _header(report: dict, path: str) -> list:
    c = report["config"]
    minutes = report["wall_s"] / 60
    return [
        f"Run `{path}`:",
        "",
        f"- command: `{report.get('command') or '(not recorded)'}`",
        f"- wall time: {minutes:.1f} min for {report['total_rows']} rows "
        f"({report['s_per_row']:.1f} s/row, model load {report['model_load_s']:.0f} s "
        "included)",
        f"- generator `{c['generator_model']}`, verifier `{c['verifier_model']}` ({c['dtype']}); "
        f"AVG@{c['n_samples']}; rows per file <= {c['max_rows'] or 'all'} "
        f"({c['row_subset']}); K <= {c['max_k'] or 'all'}; calibration {c['calibration']}; "
        f"generator input {c['generator_input_budget']} / output {c['max_new_tokens']} "
        f"tokens, verifier prefix {c['verifier_max_prefix_tokens']} tokens; "
        f"{c['n_bootstrap']} bootstrap replicates, seed {c['seed']}",
    ]


def results_markdown(reports: dict) -> str:
    """results.md text of {run dir: report dict} (several runs: their files are listed
    together; the macro average is given per run)."""
    out = ["# Evaluator benchmark results", "",
           "This page holds the evaluator benchmark's tables: how well each evaluator "
           "(dynamic and static rubrics, direct judges, random scores) orders ranked "
           "response sets, with bootstrap CIs (written by `experiments.report_evaluator`).",
           ""]
    for run, rep in reports.items():
        out += _header(rep, run) + [""]
    out += ["Cells: mean over the n samples [95% bootstrap CI, rows resampled]. Strict "
            "accuracy counts a predicted tie as wrong; top-1 and nDCG are given for "
            "listwise files (K > 2).", ""]
    for run, rep in reports.items():
        out += ["## Macro average over files" + (f" ({run})" if len(reports) > 1 else ""), ""]
        head = ["method", "strict acc", "tie rate", "acc (ties excl.)", "top-1", "nDCG"]
        rows = [[m] + [_cell(e[k]) for k in ("strict_acc", "tie_rate", "acc_ties_excluded",
                                              "top1", "ndcg")]
                for m, e in rep["macro"].items()]
        out += _table(head, rows) + [""]
        if rep.get("macro_differences"):
            out += ["Paired differences of strict accuracy (macro):", ""]
            out += _table(["difference", "strict acc"],
                          [[k, _cell(v)] for k, v in rep["macro_differences"].items()]) + [""]
    out += ["## At chance, per file", ""]
    for rep in reports.values():
        out += [chance_statement(_name(p), s) for p, s in rep["files"].items()]
    out += ["", "## Per file", ""]
    for rep in reports.values():
        for path, s in rep["files"].items():
            out += [f"### {_name(path)} ({s['n_rows']} rows, {s['wall_s'] / 60:.1f} min)", ""]
            keys = ["strict_acc", "tie_rate", "acc_ties_excluded"] + (
                list(LISTWISE_METRICS) if s["listwise"] else [])
            head = ["method"] + [{"strict_acc": "strict acc", "tie_rate": "tie rate",
                                  "acc_ties_excluded": "acc (ties excl.)", "top1": "top-1",
                                  "ndcg": "nDCG"}[k] for k in keys] + ["s/row"]
            rows = [[m] + [_cell(e[k]) for k in keys] + [f"{s['timing'][m]['s_per_row']:.2f}"]
                    for m, e in s["methods"].items()]
            out += _table(head, rows) + [""]
            if s.get("differences"):
                out += _table(["paired difference", "strict acc"],
                              [[k, _cell(v["strict_acc"])]
                               for k, v in s["differences"].items()]) + [""]
    return "\n".join(out) + "\n"


def plot(reports: dict, path: str) -> None:
    """Strict pairwise accuracy with 95% CI bars, one row per file (and the macro
    average), one marker per method; PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []  # (label, {method: entry})
    for rep in reports.values():
        rows += [(_name(p), {m: e["strict_acc"] for m, e in s["methods"].items()})
                 for p, s in rep["files"].items()]
        rows.append(("macro average", {m: e["strict_acc"] for m, e in rep["macro"].items()}))
    methods = [m for m in dict.fromkeys(m for _, d in rows for m in d)
               if m not in HIDDEN_IN_PLOT]
    fig, ax = plt.subplots(figsize=(8, 0.42 * len(rows) + 1.2), dpi=80)
    cmap = plt.get_cmap("tab20")
    step = 0.8 / max(len(methods), 1)
    for j, m in enumerate(methods):
        ys, xs, err = [], [], [[], []]
        for i, (_, d) in enumerate(rows):
            mean = _num(d[m]["mean"]) if m in d else float("nan")
            if not math.isfinite(mean):
                continue
            lo, hi = (_num(x) for x in d[m]["ci95"])
            ys.append(i - 0.4 + (j + 0.5) * step)
            xs.append(mean)
            err[0].append(max(mean - lo, 0.0))
            err[1].append(max(hi - mean, 0.0))
        ax.errorbar(xs, ys, xerr=err, fmt="o", ms=3, lw=0.8, color=cmap(j % 20), label=m)
    ax.axvline(PAIR_CHANCE, color="grey", ls="--", lw=0.8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("strict pairwise accuracy (ties wrong), 95% bootstrap CI; dashed: chance")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
