"""Learning curves of policy runs: did the reward go up, and by more than chance?

A policy run's metrics.jsonl has one `kind: train`, `phase: policy` row per GRPO step,
holding the step's mean reward (`policy_reward`) and each prompt group's mean reward
(`group_mean_rewards`, one per prompt of the step: `phases._policy_advantages`). The
summary compares the last steps with the first ones:

    difference = mean over the groups of the last `last` steps
                 - mean over the groups of the first `first` steps

with a percentile-bootstrap 95% CI that resamples prompt groups (the independent units of
a GRPO step: the K responses of a group share one prompt) within each window
independently. An interval that holds 0 is "inside its CI": no evidence of learning.

Axis legend (docs/CONVENTIONS.md): here S steps of a curve, U groups in a window.
"""
from __future__ import annotations

import numpy as np

from drubric_jax.evaluation.intervals import percentile_interval, resample_weights
from drubric_jax.rounds.run_logging import read_metrics


def policy_curve(metrics_path: str) -> tuple[np.ndarray, np.ndarray, list]:
    """The policy steps of a run, in order.

    Returns:
        (steps int64[S] global step numbers, rewards float64[S] mean reward per step,
        groups [S] lists of each step's group mean rewards; non-finite groups dropped).

    Raises:
        ValueError: the file has no policy train rows (names the file).
    """
    rows = [r for r in read_metrics(metrics_path)
            if r.get("kind") == "train" and r.get("phase") == "policy"]
    if not rows:
        raise ValueError(f"{metrics_path}: no policy training rows (kind=train, phase=policy)")
    rows.sort(key=lambda r: r["global_step"])
    groups = []
    for r in rows:
        # "nan" is how metrics.jsonl writes a group with no scorable response.
        g = np.asarray([float(x) for x in r.get("group_mean_rewards", [])], np.float64)
        groups.append(g[np.isfinite(g)].tolist())
    return (np.asarray([r["global_step"] for r in rows], np.int64),
            np.asarray([float(r["policy_reward"]) for r in rows], np.float64), groups)


def first_last_difference(groups: list, first: int = 5, last: int = 5,
                          n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """Mean group reward of the last `last` steps minus that of the first `first` steps,
    with a percentile-bootstrap CI over prompt groups (module docstring).

    Args:
        groups: per step, the list of its group mean rewards (`policy_curve`).
        first, last: window sizes in steps (windows may not overlap).
        n_boot: bootstrap replicates; seed: their numpy seed (same seed, same interval).

    Returns:
        {"first_mean", "last_mean", "difference", "ci": [lo, hi], "level", "first_steps",
        "last_steps", "first_groups", "last_groups", "zero_inside_ci": bool}.

    Raises:
        ValueError: fewer than first + last steps, or a window with no finite group.
    """
    if first < 1 or last < 1 or len(groups) < first + last:
        raise ValueError(f"need >= first + last = {first} + {last} steps with first, last "
                         f">= 1; the curve has {len(groups)}")
    a = np.asarray([x for g in groups[:first] for x in g], np.float64)
    b = np.asarray([x for g in groups[-last:] for x in g], np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError("a window has no scorable prompt group")
    # Independent replicates for the two windows (different seeds): they are different
    # prompts drawn at different steps, so nothing pairs them.
    ra = resample_weights(a.size, n_boot, seed) @ a / a.size
    rb = resample_weights(b.size, n_boot, seed + 1) @ b / b.size
    lo, hi = percentile_interval(rb - ra, level)
    return {"first_mean": float(a.mean()), "last_mean": float(b.mean()),
            "difference": float(b.mean() - a.mean()), "ci": [lo, hi], "level": level,
            "first_steps": first, "last_steps": last, "first_groups": int(a.size),
            "last_groups": int(b.size), "zero_inside_ci": bool(lo <= 0.0 <= hi)}


def summarize_parts(part_dirs: dict, first: int, last: int, n_boot: int, seed: int) -> dict:
    """{part: {"steps", "rewards", **first_last_difference}} for the runs of an experiment
    (`part_dirs`: part name -> its workdir, holding metrics.jsonl)."""
    out = {}
    for part, run_dir in part_dirs.items():
        steps, rewards, groups = policy_curve(f"{run_dir}/metrics.jsonl")
        out[part] = {"steps": steps.tolist(), "rewards": rewards.tolist(),
                     **first_last_difference(groups, first, last, n_boot, seed)}
    return out


def markdown_table(summary: dict, title: str, command: str, wall_s: dict) -> str:
    """results.md of a learning-curve experiment: one row per part (mean reward of the
    first / last steps, their difference with its CI, and the verdict)."""
    lines = [f"# {title}", "", f"- command: `{command}`"]
    lines += [f"- wall time of part `{p}`: {s / 60:.1f} min" for p, s in wall_s.items()]
    lines += ["", "| part | steps | first mean | last mean | last - first [95% CI] | "
              "0 inside the CI |", "|---|---|---|---|---|---|"]
    for part, s in summary.items():
        lo, hi = s["ci"]
        lines.append(f"| {part} | {len(s['steps'])} | {s['first_mean']:.3f} | "
                     f"{s['last_mean']:.3f} | {s['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}] | "
                     f"{'yes: no evidence of learning' if s['zero_inside_ci'] else 'no'} |")
    lines += ["", f"First / last: the first {s['first_steps']} and last {s['last_steps']} "
              "policy steps; the CI resamples prompt groups (percentile bootstrap).", ""]
    return "\n".join(lines)


def plot_curves(summary: dict, out_png: str) -> None:
    """Mean reward per policy step of each part, one panel each (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(summary), figsize=(5 * len(summary), 3.5), squeeze=False)
    for ax, (part, s) in zip(axes[0], summary.items()):
        x = np.arange(1, len(s["rewards"]) + 1)
        ax.plot(x, s["rewards"], marker=".")
        ax.set_title(f"{part}: last - first {s['difference']:+.3f}")
        ax.set_xlabel("policy step")
        ax.set_ylabel("mean reward")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
