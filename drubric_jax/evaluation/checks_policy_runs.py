"""What each run of the policy-reward experiment logged (`evaluation.checks_policy`): its
training and held-out gold curves and its bookkeeping (metrics.jsonl), and the settings in
which an arm differs from the gold arm of its seed (settings.json).
"""
from __future__ import annotations

import json
import os
from typing import Sequence

import numpy as np


def training_curves(metrics_path: str, reward_is_gold: bool = False) -> dict:
    """Per policy step of a run: {"steps", "proxy", "gold"}: the step's mean reward as the
    policy saw it (`policy_reward`) and its mean gold score (`gold_score`; a run rewarded
    with the gold score itself, `reward_is_gold`, logs it as its reward)."""
    from drubric_jax.rounds.run_logging import read_metrics

    rows = sorted((r for r in read_metrics(metrics_path)
                   if r.get("kind") == "train" and r.get("phase") == "policy"),
                  key=lambda r: r["global_step"])
    if not rows:
        raise ValueError(f"{metrics_path}: no policy training rows (kind=train, phase=policy)")
    return {"steps": [int(r["global_step"]) for r in rows],
            "proxy": [float(r.get("policy_reward", float("nan"))) for r in rows],
            "gold": [float(r.get("policy_reward" if reward_is_gold else "gold_score",
                                 float("nan"))) for r in rows]}


def gold_curve(metrics_path: str) -> dict:
    """The held-out gold curve of a run (`rounds.gold_curve` rows, kind "heldout_gold"):
    {"steps" (policy steps done), "greedy", "sampled", "rows"}; empty lists when the run
    logged none."""
    from drubric_jax.rounds.run_logging import read_metrics

    rows = sorted((r for r in read_metrics(metrics_path) if r.get("kind") == "heldout_gold"),
                  key=lambda r: r["global_step"])
    return {"steps": [int(r["global_step"]) for r in rows],
            "greedy": [float(r["heldout_gold_greedy"]) for r in rows],
            "sampled": [float(r["heldout_gold_sampled"]) for r in rows],
            "rows": [int(r["heldout_gold_rows"]) for r in rows]}


# The bookkeeping of a run's policy steps (`bookkeeping`): metric name in the train rows of
# metrics.jsonl -> how a run's steps reduce to one figure. "mean": the mean over the steps
# that logged it; "sum": the sum over the steps (None unless every step logged it).
BOOKKEEPING = {
    # rl/train_step.py: the answers cut at max_new_tokens among the rows that entered the
    # update (a GroupBatch's live groups; every row of a Batch); a skipped step has none.
    "truncated_fraction": "mean",
    # rounds/phases.update: the answers cut at the budget among all the step's B x K
    # sampled answers (every process), before the flat groups are cut.
    "rollout_truncated_fraction": "mean",
    "active_rows": "mean",          # rl/train_step.py: rows that entered the update
    "update_skipped": "sum",        # rl/train_step.py, rounds/phases.update: 1 = no update
    "redraws": "sum",               # rounds/loop.py: fresh batches drawn for all-flat ones
    # rounds/loop.py `_phase`: prompts the step's rollouts took from the policy prompt
    # iterator, discarded redraws included (policy.prompts_per_step x (1 + redraws)).
    "prompts_drawn": "sum",
}


def bookkeeping(metrics_path: str) -> dict:
    """What a run's policy steps did besides learning, from its metrics.jsonl train rows
    (kind "train", phase "policy"; `BOOKKEEPING` names the metrics and their reduction).

    Returns:
        {"steps": policy steps logged, name: float or None for each BOOKKEEPING name}:
        a "mean" metric is the mean over the steps that logged it (None when none did), a
        "sum" metric the total over the steps (None unless every step logged it).

    Raises:
        ValueError: no policy training row (names the file).
    """
    from drubric_jax.rounds.run_logging import read_metrics

    rows = [r for r in read_metrics(metrics_path)
            if r.get("kind") == "train" and r.get("phase") == "policy"]
    if not rows:
        raise ValueError(f"{metrics_path}: no policy training rows (kind=train, phase=policy)")
    out: dict = {"steps": len(rows)}
    for name, how in BOOKKEEPING.items():
        vals = [float(r[name]) for r in rows if name in r]
        if how == "mean":
            out[name] = float(np.mean(vals)) if vals else None
        else:
            out[name] = float(np.sum(vals)) if len(vals) == len(rows) else None
    return out


def bookkeeping_over_seeds(per_seed: dict) -> dict:
    """{"steps", name: ...}: the mean over the seeds of each `bookkeeping` figure (None
    when a seed lacks it). per_seed: {seed: `bookkeeping` output}."""
    keys = ["steps", *BOOKKEEPING]
    out = {}
    for k in keys:
        vals = [v.get(k) for v in per_seed.values()]
        out[k] = (float(np.mean(vals)) if vals and all(x is not None for x in vals)
                  else None)
    return out


SETTINGS_FILE = "settings.json"  # a run's resolved settings, {"dotted.config.field": value}
# The fields in which an arm may differ from the gold arm: its reward, and which generator
# writes its lists (METHOD 15, "Arms"). A field matches one of these or lies under it.
ARM_FIELDS = ("policy.reward", "model.generator",
              # What follows from the reward: whether it reads the prompts' true checks, and
              # whether a generator is loaded at all (`rounds.settings_types.RoleUse`).
              "data.true_checks_reward", "roles.generator_loaded")


def _is_arm_field(field: str, allowed: Sequence[str]) -> bool:
    return any(field == a or field.startswith(a + ".") for a in allowed)


def settings_differences(workdir: str, arms: Sequence[str], seeds: Sequence[int],
                         reference: str = "gold",
                         allowed: Sequence[str] = ARM_FIELDS) -> dict:
    """Per arm and seed, the settings whose value differs from the `reference` arm's of the
    same seed, read from each run's settings.json (a flat {"dotted.config.field": value}).

    Returns:
        {arm: {seed: {"differ": {field: {"arm": its value, "reference": the reference
        arm's}} (a side that lacks the field has no key), "outside": the differing fields
        not in `allowed` (empty: the arms differ only in their reward and generator)} or
        {"missing": [the settings.json paths absent, relative to `workdir`]}}} for every
        arm other than `reference` and every seed whose run directory exists; {} when the
        reference arm is not among `arms`.
    """
    if reference not in arms:
        return {}
    out: dict = {}
    for arm in (a for a in arms if a != reference):
        for s in seeds:
            if not os.path.isdir(run_dir(workdir, s, arm)):
                continue
            paths = [os.path.join(run_dir(workdir, s, x), SETTINGS_FILE) for x in (arm, reference)]
            # Named relative to the workdir: the report reads the same on any machine.
            missing = [os.path.relpath(p, workdir) for p in paths if not os.path.exists(p)]
            if missing:
                out.setdefault(arm, {})[str(s)] = {"missing": missing}
                continue
            mine, ref = (_read(p) for p in paths)
            differ = {k: {**({"arm": mine[k]} if k in mine else {}),
                          **({"reference": ref[k]} if k in ref else {})}
                      for k in sorted(set(mine) | set(ref))
                      if (k in mine) != (k in ref) or mine.get(k) != ref.get(k)}
            out.setdefault(arm, {})[str(s)] = {
                "differ": differ, "outside": [k for k in differ if not _is_arm_field(k, allowed)]}
    return out


def run_dir(workdir: str, seed: int, arm: str) -> str:
    """The loop run of one arm and seed: <workdir>/seed<seed>/<arm>."""
    return os.path.join(workdir, f"seed{seed}", arm)


def _read(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)
