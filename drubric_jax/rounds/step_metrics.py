"""The host metrics of one phase step: rewards, their group spreads, rubric statistics.

    policy_reward_metrics     mean reward, flat / unscorable fractions, group means (Eq. 21)
    generator_reward_metrics  each generator reward's mean and group spread (Eq. 24-25)
    rubric_stats              parse-valid rate, items per list, weight histogram, yes-rate,
                              zero-variance items
    mean_spread               the mean std Eq. 21 divided non-flat groups by
    verifier_moe_metrics      a mixture-of-experts verifier's router load (none if dense)
    gold_metrics              checks world: gold score g of the policy's samples beside the
                              proxy (rubric) score they were trained on (METHOD 13)
    constraint_metrics        checks world: precision / recall / F1 of the generator's
                              checks against the prompts' true checks (METHOD 13)
    item_rate_metrics         checks world: invalid and duplicate item rates of a step

Axis legend (docs/CONVENTIONS.md): B groups (prompts, or generator inputs), G rubric lists
per input, K responses, M items, R rows (flat, grouped by id).
"""
from __future__ import annotations

import numpy as np

from drubric_jax.evaluator.counters import LOAD_COUNTS
from drubric_jax.models.qwen3_moe import load_summary
from drubric_jax.rl import advantages as adv_lib


def mean_spread(rewards, group_ids, num_groups: int) -> float:
    """Mean over non-flat groups of the std Eq. 21 divided their rewards by (0 if none).

    Args:
        rewards: float[R]; group_ids: int[R] in [0, num_groups).
    """
    std = np.asarray(adv_lib.group_std_by_id(rewards, group_ids, num_groups))
    return float(std[std > 0].mean()) if np.any(std > 0) else 0.0


def policy_reward_metrics(scores, group_ids, num_groups: int, flat) -> dict:
    """Metrics of R policy rewards grouped by prompt id: the mean finite reward, the
    flat-group fraction, the mean group std (Eq. 21's divisor), the unscorable (non-finite)
    fraction and each group's mean reward (`group_mean_rewards`, float64[B], nan for a group
    with no finite reward: the unit a learning curve's confidence interval resamples).

    Args:
        scores: float[R]; group_ids: int[R] in [0, num_groups); flat: bool[B], the flat
            groups of the Eq. 21 advantages (`advantages.group_advantages_by_id`).
    """
    r = np.asarray(scores, np.float64)
    ok = np.isfinite(r)
    sums = np.bincount(group_ids[ok], r[ok], minlength=num_groups)
    counts = np.bincount(group_ids[ok], minlength=num_groups)
    return dict(
        policy_reward=float(r[ok].mean()) if ok.any() else 0.0,
        flat_group_fraction=float(np.mean(flat)),
        reward_std=mean_spread(scores, group_ids, num_groups),
        unscorable_fraction=float(np.mean(~ok)),
        group_mean_rewards=np.where(counts > 0, sums / np.maximum(counts, 1), np.nan))


def generator_reward_metrics(rewards: dict, group_ids, num_groups: int) -> dict:
    """`r_<name>` (the mean) of every generator reward, then `r_<name>_std` of each (the
    mean group std its Eq. 24-25 advantage divided by, `mean_spread`), in the order of
    `rewards`.

    Args:
        rewards: {name: float32[B, G]} (`rl.generator_rewards.GENERATOR_REWARDS` order).
        group_ids: int[B * G], the input of each flattened list; num_groups: B.
    """
    out = {f"r_{name}": float(r.mean()) for name, r in rewards.items()}
    out.update({f"r_{name}_std": mean_spread(r.reshape(-1), group_ids, num_groups)
                for name, r in rewards.items()})
    return out


def rubric_stats(weights, item_mask, list_valid, verdicts) -> dict:
    """Rubric statistics of one step: parse-valid rate, items per valid list, weight
    histogram (weights 1..5), mean yes-rate (mean verdict: the mean P(yes) for soft
    verdicts), fraction of zero-variance items (every response got the same verdict, to
    1e-6: such an item separates nothing, Eq. 13).

    Args:
        weights: int32[R, M]; item_mask: bool[R, M]; list_valid: bool[R] (R rubric lists);
        verdicts: float32[R, K, M] verdicts on the responses each list judged.
    """
    item_mask = np.asarray(item_mask, bool) & np.asarray(list_valid, bool)[:, None]
    n_items = item_mask.sum()
    v = np.asarray(verdicts, np.float32)
    vbar = v.mean(axis=1)                                                 # [R, M]
    flat = (v.max(axis=1) - v.min(axis=1)) <= 1e-6
    hist = [int(((np.asarray(weights) == w) & item_mask).sum()) for w in range(1, 6)]
    return {
        "parse_valid_rate": float(np.mean(list_valid)),
        "items_per_list": float(n_items / max(1, np.sum(list_valid))),
        "weight_hist": hist,
        "yes_rate": float(vbar[item_mask].mean()) if n_items else 0.0,
        "zero_variance_item_fraction": float(flat[item_mask].mean()) if n_items else 0.0,
    }


def verifier_moe_metrics(stats: dict) -> dict:
    """The router load of a mixture-of-experts verifier in one step, from the `stats=` dict
    of its calls (`counters.LOAD_COUNTS`: measured on the first pass of each call, see
    `evaluator.chunked`), summarised by `qwen3_moe.load_summary`:

        verifier_moe_max_load      the worst layer's busiest expert against a uniform router
                                   (max_e pairs_e * E / (N k); 1.0 is balanced)
        verifier_moe_dropped_frac  (token, expert) pairs dropped by the capacity / all
                                   routed pairs, over every layer (GShard / Switch capacity)
        verifier_moe_dead_experts  the most experts of one layer that received no pair
        verifier_moe_routed_pairs  the (token, expert) pairs measured per layer (N k, N the
                                   real tokens: padding not counted)

    A dense verifier (no such counts): {}.
    """
    if not all(k in stats for k in LOAD_COUNTS):
        return {}
    counts = {key: stats[name] for name, key in LOAD_COUNTS.items()}
    s = load_summary(counts)
    routed = np.asarray(counts["routed"], np.int64)
    return {
        "verifier_moe_max_load": float(s["max_load"].max()),
        "verifier_moe_dropped_frac": float(np.sum(counts["dropped"]) / max(routed.sum(), 1)),
        "verifier_moe_dead_experts": int(s["dead"].max()),
        "verifier_moe_routed_pairs": int(routed[0]),
    }


def gold_metrics(true_checks, sets, proxy=None, loose: bool = False) -> dict:
    """The gold score g(x, y) (METHOD 13: the fraction of x's true checks y meets) of the
    policy's samples, over the prompts that have true checks.

    Args:
        true_checks: B entries, each the prompt's T(x) ({"check", "args"} mappings) or
            None / [] for a prompt without checks.
        sets: B lists of K response texts.
        proxy: optional float[B, K], the rubric (Eq. 12) scores the samples got.
        loose: IFEval's loose verdict per check.

    Returns:
        {} when no prompt has checks; else {"gold_score": mean g, "gold_all_met_fraction":
        the fraction of samples meeting every true check (IFEval's prompt-level accuracy),
        "group_gold": the mean g of each prompt with checks (a list, in batch order), and
        with `proxy` "proxy_score": the mean rubric score of the same samples and
        "group_proxy": each of those prompts' mean rubric score}. The per-prompt lists let
        an experiment put a CI on the proxy-minus-gold gap of a round's training samples
        (`evaluation.coevolution_rounds`).
    """
    from drubric_jax import checks  # the checkers import in a second: only when used

    rows = [b for b, t in enumerate(true_checks) if t]
    if not rows:
        return {}
    g = np.array([[checks.gold_score(true_checks[b], y, loose) for y in sets[b]]
                  for b in rows], np.float64)
    out = {"gold_score": float(g.mean()), "gold_all_met_fraction": float(np.mean(g == 1.0)),
           "group_gold": g.mean(axis=1).tolist()}
    if proxy is not None:
        p = np.asarray(proxy, np.float64)[rows]
        out["proxy_score"] = float(p.mean())
        out["group_proxy"] = p.mean(axis=1).tolist()
    return out


def constraint_metrics(texts, item_mask, true_checks) -> dict:
    """Constraint recovery of rubric lists of checks (METHOD 13; `checks.recovery`),
    averaged over the lists whose prompt has true checks; an invalid list (no item) has
    precision = recall = F1 = 0.

    Args:
        texts: L lists of M item texts (`check_rubrics.item_text`; "" at padding).
        item_mask: bool[L, M] the kept items.
        true_checks: L entries, T(x) of the list's prompt or None / [].

    Returns:
        {} when no list has true checks; else constraint_precision, constraint_recall,
        constraint_f1 (check id and args equal) and constraint_f1_check_id (ids alone).
    """
    from drubric_jax.checks.recovery import constraint_prf
    from drubric_jax.evaluator.check_rubrics import item_of_text

    rows = [i for i, t in enumerate(true_checks) if t]
    if not rows:
        return {}
    prf, ids = [], []
    for i in rows:
        items = [item_of_text(t) for t, on in zip(texts[i], item_mask[i]) if on]
        prf.append(constraint_prf(items, true_checks[i]))
        ids.append(constraint_prf(items, true_checks[i], ids_only=True)[2])
    p, r, f = np.mean(np.array(prf, np.float64), axis=0)
    return {"constraint_precision": float(p), "constraint_recall": float(r),
            "constraint_f1": float(f), "constraint_f1_check_id": float(np.mean(ids))}


def item_rate_metrics(counters: dict) -> dict:
    """Invalid and duplicate item rates of one step's rubric lists, from the generator's
    counters (`RubricBatch.counters`, `check_rubrics.CHECK_COUNTER_KEYS`): each count over
    the items written in parseable lists (kept + dropped; 0 when there were none).

    Returns:
        {"invalid_item_rate": invalid_check / items, "duplicate_item_rate": duplicate /
        items, "invalid_list_rate": 1 - valid_lists / lists}.
    """
    items = counters.get("items_kept", 0) + counters.get("items_dropped", 0)
    lists = counters.get("lists", 0)
    return {"invalid_item_rate": counters.get("invalid_check", 0) / max(items, 1),
            "duplicate_item_rate": counters.get("duplicate", 0) / max(items, 1),
            "invalid_list_rate": 1 - counters.get("valid_lists", 0) / max(lists, 1)}
