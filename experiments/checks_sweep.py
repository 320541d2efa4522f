r"""The table of world v2's gold-arm LoRA sweep (issue 40): one row per run of

    python -m experiments.sweep --config=configs/checks_policy.py:arm=gold --workdir=runs/v2_sweep
    python -m experiments.checks_sweep --workdir=runs/v2_sweep --out=results/checks_world_v2/sweep.md

Each run (`configs/checks_policy.py` `get_sweep`: LoRA rank and policy learning rate) logs
its held-out gold curve (`rounds.gold_curve`, the first `rounds.heldout_gold_rows` held-out
prompts, greedy and one sample at the training temperature). The table gives, per run, the
curve's first and last points, the training batches' gold over the first and last
--window steps, the flat-group fraction, and the mean seconds of a policy step by phase
(metrics.jsonl `seconds_*`). The pick is the run with the highest last held-out gold
(greedy + sampled, averaged); with 64 prompts each point's standard error is about 0.05,
so the table says which settings are clearly worse, not a precise optimum.
"""
from __future__ import annotations

import json
import os

import numpy as np
from absl import flags
from experiments import cli  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "Parent of the sweep's runs.")
_OUT = flags.DEFINE_string("out", None, "Markdown file to write (and print).")
_WINDOW = flags.DEFINE_integer("window", 5, "Training steps averaged at each end.")
_NOTE = flags.DEFINE_string("note", "", "A line added under the table (how the runs were made).")
flags.mark_flags_as_required(["workdir", "out"])


def run_row(run_dir: str, window: int) -> dict:
    """One run's row (module docstring). Raises FileNotFoundError without metrics.jsonl."""
    from drubric_jax.evaluation.checks_policy import gold_curve, training_curves
    from drubric_jax.rounds.run_logging import read_metrics

    with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    curve = gold_curve(metrics)
    train = training_curves(metrics, reward_is_gold=True)
    rows = [r for r in read_metrics(metrics) if r.get("kind") == "train"
            and r.get("phase") == "policy"]
    # Steps after the first (compilation) for the per-step seconds.
    warm = rows[1:] or rows
    secs = {k: float(np.mean([r.get(k, 0.0) for r in warm]))
            for k in sorted({k for r in warm for k in r if k.startswith("seconds_")})}
    w = min(window, max(1, len(train["gold"]) // 2))
    return {"run": os.path.basename(run_dir), "rank": cfg["lora"]["rank"],
            "lr": cfg["policy"]["train"]["learning_rate"], "steps": len(train["gold"]),
            "curve": curve, "train_first": float(np.mean(train["gold"][:w])),
            "train_last": float(np.mean(train["gold"][-w:])),
            "flat": float(np.mean([r.get("flat_group_fraction", np.nan) for r in rows])),
            "seconds": secs}


def markdown(rows: list, command: str, note: str = "") -> str:
    lines = ["# World v2: LoRA sweep of the gold arm (seed 0)", "",
             f"Runs: `{command}`; table: `python -m experiments.checks_sweep "
             f"--workdir=... --out=...`.", "",
             "| rank | policy lr | steps | held-out gold first (greedy / sampled) | held-out "
             "gold last (greedy / sampled) | train gold first | train gold last | flat "
             "groups | s / step (sampling, update, total) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["curve"]
        first = f"{c['greedy'][0]:.3f} / {c['sampled'][0]:.3f}" if c["steps"] else "-"
        last = (f"{c['greedy'][-1]:.3f} / {c['sampled'][-1]:.3f} (step {c['steps'][-1]})"
                if c["steps"] else "-")
        s = r["seconds"]
        total = sum(v for k, v in s.items() if k != "seconds_compile")
        lines.append(f"| {r['rank']} | {r['lr']:g} | {r['steps']} | {first} | {last} | "
                     f"{r['train_first']:.3f} | {r['train_last']:.3f} | {r['flat']:.2f} | "
                     f"{s.get('seconds_sampling', 0):.1f}, {s.get('seconds_update', 0):.1f}, "
                     f"{total:.1f} |")
    scored = [r for r in rows if r["curve"]["steps"]]
    if scored:
        best = max(scored, key=lambda r: r["curve"]["greedy"][-1] + r["curve"]["sampled"][-1])
        n = best["curve"]["rows"][-1]
        lines += ["", f"Pick: rank {best['rank']}, learning rate {best['lr']:g} (the highest "
                  f"last held-out gold, greedy + sampled, on {n} prompts; one seed)."]
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    runs = sorted(d for d in os.listdir(_WORKDIR.value)
                  if os.path.exists(os.path.join(_WORKDIR.value, d, "metrics.jsonl")))
    rows = [run_row(os.path.join(_WORKDIR.value, d), _WINDOW.value) for d in runs]
    text = markdown(rows, f"python -m experiments.sweep --config=configs/checks_policy.py:"
                          f"arm=gold --workdir={_WORKDIR.value}", _NOTE.value)
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    with open(_OUT.value, "w", encoding="utf-8") as f:
        f.write(text)
    from drubric_jax.data import write_json

    write_json(os.path.splitext(_OUT.value)[0] + ".json", rows)
    print(text, flush=True)


if __name__ == "__main__":
    cli.run(main)
