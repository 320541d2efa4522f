"""Does a rubric reward raise the gold score? Held-out gold evaluation and the summary of the
policy-reward experiment in the checks world (issue 32, question 1; METHOD 13).

Each arm trains the policy P_0 with GRPO on one reward (`ARMS`): the gold score itself (the
RLVR upper bound), or the rubric score (Eq. 12) of a generator's checks judged by their
checkers. Every policy, P_0 included, then answers the held-out checks-world prompts
greedily, and each answer gets its gold score g(x, y) (METHOD 13). Reported per arm and seed:

    after - P_0 = mean over held-out prompts of g(x, y_after) - g(x, y_P0)

with a paired percentile-bootstrap 95% CI over prompts (both policies answer the same
prompts, so one set of replicate weights serves both), and across seeds the mean, standard
deviation and range of that difference. A figure pooled over seeds (an arm's gain over P_0,
an arm against an arm, a share of the gold arm's gain) is the mean over seeds of each
seed's prompt mean, with the two-stage bootstrap of METHOD 15 (seeds drawn, then prompts;
a prompt is the same prompt in every seed, so it is drawn by id once for all the drawn
seeds: `intervals.two_stage_weights`), its standard error and the smallest difference the
design could have detected. The training curves (the step's mean proxy reward, i.e. what
the policy was trained on, and its mean gold score) and each run's bookkeeping (answers
cut at the token budget, active rows, skipped updates, redraws, prompts drawn:
`bookkeeping`) come from each run's metrics.jsonl; the settings in which an arm differs
from the gold arm of its seed from each run's settings.json (`settings_differences`).

Axis legend (docs/CONVENTIONS.md): here U held-out prompts, Bt bootstrap replicates.
"""
from __future__ import annotations

import json
import os
from typing import Sequence

import numpy as np

# The experiment's statistics and what its runs logged, re-exported: callers read them here.
from drubric_jax.evaluation.checks_policy_runs import (ARM_FIELDS, BOOKKEEPING,  # noqa: F401
                                                       SETTINGS_FILE, _read, run_dir,
                                                       bookkeeping,
                                                       bookkeeping_over_seeds, gold_curve,
                                                       settings_differences, training_curves)
from drubric_jax.evaluation.checks_policy_stats import (arm_versus_arm,  # noqa: F401
                                                        paired_difference,
                                                        pooled_difference,
                                                        pooled_share_of_gold, seed_spread,
                                                        share_of_gold)

# arm -> what the policy is rewarded with (configs/checks_policy.py sets the run fields).
ARMS = {
    "gold": "the gold score g(x, y) (rule reward checks_gold; the upper bound)",
    "oracle": "the rubric score of the oracle generator's list: the prompt's true checks, "
              "equal weights (rule reward checks_oracle; any rubric reward's upper bound)",
    "rubric_sft": "the rubric score of the warm-started generator G_sft's checks",
    "rubric_g0": "the rubric score of the untrained generator G_0's checks",
    "rubric_trained": "the rubric score of a generator trained on the anchor lists",
}
REWARD_IS_GOLD = ("gold", "oracle")  # arms whose training reward is the gold score itself
P0_FILE = "p0_heldout.json"      # P_0's held-out answers and gold scores, in the workdir
HELDOUT_FILE = "heldout.json"     # a trained policy's, in its run directory


def heldout_gold(model: str, items: Sequence, *, max_prompt_tokens: int, max_new_tokens: int,
                 batch: int = 32, dtype: str = "float32", samples: int = 0,
                 temperature: float = 1.0, seed: int = 0) -> dict:
    """Greedy answers of `model` to held-out checks-world prompts and their gold scores, and
    (samples > 0) `samples` answers per prompt at `temperature`.

    Prompts are rendered as in the policy phase (`rounds.phases.policy_prompt_ids`: history
    + request in the chat template, cut to `max_prompt_tokens`); `policy_eval.answers`
    decodes them, `batch` prompts per sampler call. Sample s of prompt u draws with row id
    s * U + u under PRNGKey(seed) (`per_row_keys`): the same rows whatever `batch` is.

    Args:
        model: a `models.load_model` source (the packaged default, a .gguf, an HF export dir).
        items: U `PromptItem`s whose meta holds their true checks (`meta["checks"]`).

    Returns:
        {"model", "ids" [U], "gold" [U] float (nan: no scorable check), "answers" [U],
        "truncated" int, "max_new_tokens", "max_prompt_tokens"}, and with samples > 0
        "gold_sampled" [U] (each prompt's mean over its samples), "sampled_gold" [S][U],
        "sampled_truncated" int, "samples", "temperature"; "by_check" {label: {"greedy",
        "sampled"}} the pass rate of each check variant (`checks.pool.label_of`).

    Raises:
        ValueError: an item without true checks (names its id).
    """
    import jax

    from drubric_jax import models
    from drubric_jax.evaluation import policy_eval

    for it in items:
        if not (it.meta or {}).get("checks"):
            raise ValueError(f"held-out prompt {it.id!r}: no meta.checks (true checks)")
    cfg, params, tokenizer = models.load_model(model, dtype)
    # Greedy decoding draws nothing; the key is a required argument only.
    answers, cut = policy_eval.answers(
        cfg, params, tokenizer, [it.prompt for it in items], key=jax.random.PRNGKey(0),
        max_prompt_tokens=max_prompt_tokens, max_new_tokens=max_new_tokens, temperature=0.0,
        rows_per_call=batch, histories=[list(it.history) for it in items])
    out = {"model": model, "ids": [it.id for it in items],
           "gold": gold_of(items, answers), "answers": answers,
           "truncated": int(np.sum(cut)), "max_new_tokens": int(max_new_tokens),
           "max_prompt_tokens": int(max_prompt_tokens)}
    if samples:
        u = len(items)
        reqs = [it.prompt for it in items] * int(samples)
        sampled, scut = policy_eval.answers(
            cfg, params, tokenizer, reqs, key=jax.random.PRNGKey(seed),
            max_prompt_tokens=max_prompt_tokens, max_new_tokens=max_new_tokens,
            temperature=float(temperature), rows_per_call=batch,
            histories=[list(it.history) for it in items] * int(samples), per_row_keys=True)
        per = [gold_of(items, sampled[s * u:(s + 1) * u]) for s in range(int(samples))]
        out.update(gold_sampled=np.nanmean(np.asarray(per, np.float64), axis=0).tolist(),
                   sampled_gold=per, sampled_answers=sampled,
                   sampled_truncated=int(np.sum(scut)), samples=int(samples),
                   temperature=float(temperature))
    out["by_check"] = pass_rates_by_check(items, answers, out.get("sampled_answers"))
    return out


def pass_rates_by_check(items: Sequence, greedy: Sequence[str], sampled=None) -> dict:
    """{variant label: {"greedy": pass rate, "sampled": pass rate or nan, "n": checks}}
    over every true check of the held-out prompts (`checks.pool.label_of` names a check by
    its world-v2 variant, else its id). `sampled`: S * U answers, sample-major."""
    from drubric_jax.checks import gold_score
    from drubric_jax.checks.pool import label_of

    u = len(items)
    s = len(sampled) // u if sampled else 0
    acc: dict = {}
    for i, it in enumerate(items):
        for t in it.meta["checks"]:
            a = acc.setdefault(label_of(t["check"], t["args"]), {"g": [], "s": []})
            a["g"].append(gold_score([t], greedy[i]))
            a["s"] += [gold_score([t], sampled[j * u + i]) for j in range(s)]
    nan = float("nan")
    return {k: {"greedy": float(np.mean(v["g"])), "n": len(v["g"]),
                "sampled": float(np.mean(v["s"])) if v["s"] else nan}
            for k, v in sorted(acc.items())}


def heldout_setup(config, path: str, rows: int, batch: int) -> tuple[list, dict]:
    """The held-out prompts of `path` (the first `rows`; 0 = all) and the `heldout_gold`
    arguments of a run config: its policy's prompt and answer lengths, dtype and
    temperature, `batch` prompts per sampler call, `experiment.eval_samples` samples per
    prompt (0: greedy only), the config's seed.

    Under config.data.require_splits (world v2's splits) every row of `path` answered must
    be of the heldout split (`data.splits.STAGE_SPLITS["policy_heldout"]`).

    Raises:
        FileNotFoundError: no file at `path`.
        data.splits.SplitError (a ValueError): a row of another split, naming the file,
            its line and id, the split found and "heldout".
    """
    from drubric_jax.data.schema import load_jsonl
    from drubric_jax.data.sources import prompts_from_jsonl
    from drubric_jax.data.splits import STAGE_NAMES, STAGE_SPLITS, require_split

    if config.data.require_splits:
        records = load_jsonl(path)
        require_split(records[:int(rows)] if rows else records,
                      STAGE_SPLITS["policy_heldout"], path,
                      STAGE_NAMES["policy_heldout"])
    items = prompts_from_jsonl(path)
    items = items[:int(rows)] if rows else items
    e = config.get("experiment", {})
    # World v2 scores samples at the training temperature too (experiment.eval_samples).
    return items, dict(max_prompt_tokens=int(config.policy.max_prompt_tokens),
                       max_new_tokens=int(config.policy.max_new_tokens), batch=int(batch),
                       dtype=config.model.dtype, samples=int(e.get("eval_samples", 0)),
                       temperature=float(config.policy.temperature), seed=int(config.seed))


def gold_of(items: Sequence, answers: Sequence[str]) -> list:
    """g(x, y) (METHOD 13) of each answer against its item's true checks (`meta["checks"]`);
    nan where no check is scorable (`rounds.gold_curve.gold_of`)."""
    from drubric_jax.rounds.gold_curve import gold_of as gold

    return gold(items, answers)


def pooled_over_seeds(arm: str, per_seed: dict, after: dict, sampled_after: dict, p0: dict,
                      n_boot: int, seed: int) -> dict:
    """{"pooled": `pooled_difference` of the arm's held-out gold scores against P_0's over
    its seeds, greedy; "pooled_sampled": the same on samples where every seed and P_0 have
    them}. Each held-out prompt is drawn by its id (`p0["ids"]`, the same prompts in every
    seed), the seeds first (METHOD 15's two-stage bootstrap). Empty for fewer than 2
    seeds."""
    seeds = list(per_seed)
    if len(seeds) < 2:
        return {}
    ids = [p0["ids"]] * len(seeds) if "ids" in p0 else None
    out = {"pooled": pooled_difference([after[(arm, int(s))] for s in seeds],
                                       [p0["gold"]] * len(seeds), n_boot, seed, ids)}
    if "gold_sampled" in p0 and all((arm, int(s)) in sampled_after for s in seeds):
        out["pooled_sampled"] = pooled_difference(
            [sampled_after[(arm, int(s))] for s in seeds], [p0["gold_sampled"]] * len(seeds),
            n_boot, seed, ids)
    return out


def summarize(workdir: str, arms: Sequence[str], seeds: Sequence[int], n_boot: int,
              seed: int, window: int = 5) -> dict:
    """The experiment's numbers, recomputed from its files (module docstring).

    Returns:
        {"p0": {"gold_mean", "prompts"}, "arms": {arm: {"seeds": {s: {"heldout": paired
        difference vs P_0, "curves": training_curves, "train_gold_first", "train_gold_last",
        "train_proxy_first", "train_proxy_last", "bookkeeping": `bookkeeping`}},
        "across_seeds": seed_spread of the held-out differences, "after_across_seeds":
        seed_spread of the held-out means, "bookkeeping": `bookkeeping_over_seeds`,
        "pooled" (and "pooled_sampled" where sampled scores exist): `pooled_difference`
        against P_0 over the seeds (two-stage bootstrap, METHOD 15), and for an arm other
        than gold when gold ran: "share_of_gold" {seed: `share_of_gold`, "pooled":
        `pooled_share_of_gold`}}}, "versus": {"A - B": `arm_versus_arm`: per seed both
        ran, and pooled}, "settings": `settings_differences` against the gold arm,
        "window"}. Train first / last: the mean of the first / last `window` steps.

    An arm is summarized over the seeds whose run has been evaluated (its heldout.json);
    a pair of arms is compared on the seeds both have.

    Raises:
        FileNotFoundError: a missing p0_heldout.json, or an arm with no evaluated seed
            (names the files looked for).
    """
    p0 = _read(os.path.join(workdir, P0_FILE))
    out = {"p0": {"model": p0["model"], "gold_mean": float(np.nanmean(p0["gold"])),
                  "prompts": len(p0["gold"]),
                  "truncated": p0.get("truncated"), "by_check": p0.get("by_check", {}),
                  **({"gold_sampled_mean": float(np.nanmean(p0["gold_sampled"])),
                      "samples": p0.get("samples"), "temperature": p0.get("temperature")}
                     if "gold_sampled" in p0 else {})},
           "arms": {}, "versus": {}, "window": int(window)}
    after, sampled_after = {}, {}
    for arm in arms:
        per_seed = {}
        for s in seeds:
            d = run_dir(workdir, s, arm)
            if not os.path.exists(os.path.join(d, HELDOUT_FILE)):
                continue
            h = _read(os.path.join(d, HELDOUT_FILE))
            if h["ids"] != p0["ids"]:
                raise ValueError(f"{d}/{HELDOUT_FILE}: held-out prompts differ from "
                                 f"{P0_FILE}'s")
            after[(arm, s)] = h["gold"]
            if "gold_sampled" in h:
                sampled_after[(arm, s)] = h["gold_sampled"]
            # The gold and oracle arms log their reward, which is the gold score (for the
            # oracle: Eq. 12 of the true checks, equal weights), as policy_reward.
            curves = training_curves(os.path.join(d, "metrics.jsonl"),
                                     arm in REWARD_IS_GOLD)
            w = min(window, max(1, len(curves["gold"]) // 2))
            sampled = ({"heldout_sampled": paired_difference(
                h["gold_sampled"], p0["gold_sampled"], n_boot, seed)}
                if "gold_sampled" in h and "gold_sampled" in p0 else {})
            per_seed[str(s)] = {
                "heldout": paired_difference(h["gold"], p0["gold"], n_boot, seed), **sampled,
                "by_check": h.get("by_check", {}),
                "gold_curve": gold_curve(os.path.join(d, "metrics.jsonl")),
                "truncated": h.get("truncated"), "curves": curves,
                "bookkeeping": bookkeeping(os.path.join(d, "metrics.jsonl")),
                **{f"train_{k}_{end}": float(np.nanmean(curves[k][:w] if end == "first"
                                                        else curves[k][-w:]))
                   for k in ("gold", "proxy") for end in ("first", "last")}}
        if not per_seed:
            raise FileNotFoundError(f"arm {arm!r}: no {HELDOUT_FILE} in "
                                    f"{run_dir(workdir, '<S>', arm)} for seeds {list(seeds)}")
        out["arms"][arm] = {
            "reward": ARMS.get(arm, arm), "seeds": per_seed,
            "across_seeds": seed_spread([v["heldout"]["difference"] for v in per_seed.values()]),
            "after_across_seeds": seed_spread([v["heldout"]["after"] for v in per_seed.values()]),
            "bookkeeping": bookkeeping_over_seeds({k: v["bookkeeping"]
                                                   for k, v in per_seed.items()}),
            **pooled_over_seeds(arm, per_seed, after, sampled_after, p0, n_boot, seed)}
    # Each rubric arm's gain as a share of the gold arm's, per seed both ran and pooled.
    if "gold" in out["arms"]:
        for arm in (a for a in arms if a != "gold"):
            both = [s for s in seeds if (arm, s) in after and ("gold", s) in after]
            shares = {str(s): share_of_gold(after[(arm, s)], after[("gold", s)], p0["gold"],
                                            n_boot, seed) for s in both}
            if len(both) > 1:
                shares["pooled"] = pooled_share_of_gold(
                    [after[(arm, s)] for s in both], [after[("gold", s)] for s in both],
                    p0["gold"], n_boot, seed, [p0["ids"]] * len(both))
            out["arms"][arm]["share_of_gold"] = shares
    for i, a in enumerate(arms):
        for b in arms[i + 1:]:
            out["versus"][f"{b} - {a}"] = arm_versus_arm(after, b, a, seeds, n_boot, seed,
                                                         p0["ids"])
    out["settings"] = settings_differences(workdir, list(arms), list(seeds))
    return out
