"""Policy evaluation (METHOD 7; issue 13): pairwise win rate against reference answers
with a local judge, and HumanEval pass@1.

Win rate. For each prompt the judge (the frozen verifier's pairwise question, `judges.
pairwise_p_yes`) is asked "is Response A better than Response B?" twice: policy as A
(p_first = P(yes)) and policy as B (p_second = 1 - P(yes)). In each order the policy wins
when its probability is above 0.5. A prompt is a win when both orders say so, a loss when
neither does, and a tie when the orders disagree (the judge's verdict follows the
position, not the answers). Reported:
    win_rate          (wins + ties / 2) / n
    win_rate_first, win_rate_second   the single-order win rates (position bias)
    tie_rate          ties / n
    preference        mean of (p_first + p_second) / 2, the soft preference
    lc_win_rate       length-controlled soft preference: a logistic model of the soft
                      preference on tanh(length difference / its std), read at zero
                      length difference (AlpacaEval 2's length-controlled GLM without its
                      per-instruction term; lengths in characters)
each with a percentile-bootstrap 95% CI over prompts.

HumanEval pass@1 (`code_exec`): one answer per problem (greedy by default), its code run
against the problem's tests in the sandbox; pass@1 = passed / problems, with a bootstrap
CI over problems.

Axis legend (docs/CONVENTIONS.md): here U prompts (or problems), Bt bootstrap replicates.
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from drubric_jax.evaluation import judges
from drubric_jax.evaluation.intervals import percentile_interval, resample_weights


def answers(cfg, params, tokenizer, requests: Sequence[str], *, key, max_prompt_tokens: int,
            max_new_tokens: int, temperature: float, rows_per_call: int = 0,
            histories=None, mesh=None, per_row_keys: bool = False) -> tuple[list, np.ndarray]:
    """The policy's answer to each request (one sample each): `rounds.gold_curve
    .policy_answers` (the same arguments and returns; the loop's held-out gold curve uses it
    too)."""
    from drubric_jax.rounds.gold_curve import policy_answers

    return policy_answers(cfg, params, tokenizer, requests, key=key,
                          max_prompt_tokens=max_prompt_tokens, max_new_tokens=max_new_tokens,
                          temperature=temperature, rows_per_call=rows_per_call,
                          histories=histories, mesh=mesh, per_row_keys=per_row_keys)


def judge_pairs(verifier, params, prompts, policy_answers, references, max_tokens: int,
                histories=None) -> tuple[np.ndarray, np.ndarray]:
    """(p_first, p_second) float64[U]: the policy's probability of being better with the
    policy shown first (A) and shown second (B) (module docstring)."""
    histories = histories or [[] for _ in prompts]
    questions = []
    for p, h, y, r in zip(prompts, histories, policy_answers, references):
        questions += [(p, list(h), y, r), (p, list(h), r, y)]
    q = np.asarray(judges.pairwise_p_yes(verifier, params, questions, max_tokens), np.float64)
    return q[0::2], 1.0 - q[1::2]


def _logistic_intercept(y: np.ndarray, x: np.ndarray, w: np.ndarray, iters: int = 25):
    """Weighted logistic regression of soft targets y in [0, 1] on (1, x) by Newton's
    method with a small ridge (1e-6) for separable or constant data; returns the
    intercept's probability sigmoid(b0)."""
    X = np.stack([np.ones_like(x), x], axis=1)
    beta = np.zeros(2)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(X @ beta)))
        grad = X.T @ (w * (y - p)) - 1e-6 * beta
        hess = (X * (w * p * (1 - p))[:, None]).T @ X + 1e-6 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        beta += step
        if np.max(np.abs(step)) < 1e-10:
            break
    return 1.0 / (1.0 + np.exp(-beta[0]))


def _outcomes(a: np.ndarray, b: np.ndarray):
    """(wins, losses, ties, win1, win2) bool[U]: a win when both orders prefer the policy
    (p > 0.5), a loss when neither does, a tie when the orders disagree."""
    win1, win2 = a > 0.5, b > 0.5
    return win1 & win2, ~win1 & ~win2, win1 != win2, win1, win2


def win_units(p_first, p_second) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt: (win-rate unit float64[U]: 1 win, 1/2 tie, 0 loss; soft preference
    float64[U]: the mean of the two orders' probabilities) from `judge_pairs`; the units
    `win_rate_summary` averages."""
    a, b = np.asarray(p_first, np.float64), np.asarray(p_second, np.float64)
    wins, _, ties, _, _ = _outcomes(a, b)
    return (wins + ties / 2).astype(np.float64), (a + b) / 2


def win_rate_summary(p_first, p_second, policy_lengths, reference_lengths,
                     n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """The win-rate statistics of the module docstring, each {"value", "ci"}.

    Args:
        p_first, p_second: float[U] from `judge_pairs`.
        policy_lengths, reference_lengths: float[U] answer lengths (characters).
        n_boot: Bt bootstrap replicates over prompts; seed: their numpy seed.

    Returns:
        {"n", "wins", "losses", "ties", and per statistic {"value", "ci"}}.

    Raises:
        ValueError: no prompts, or arrays of different lengths.
    """
    a, b = np.asarray(p_first, np.float64), np.asarray(p_second, np.float64)
    dl = np.asarray(policy_lengths, np.float64) - np.asarray(reference_lengths, np.float64)
    if a.size == 0 or not (a.shape == b.shape == dl.shape):
        raise ValueError(f"need U >= 1 equal-length arrays, got {a.shape}, {b.shape}, "
                         f"{dl.shape}")
    wins, losses, ties, win1, win2 = _outcomes(a, b)
    soft = (a + b) / 2
    # tanh of the standardised length difference, as AlpacaEval 2's length term.
    scale = dl.std() if dl.std() > 0 else 1.0
    x = np.tanh(dl / scale)
    units = {"win_rate": wins + ties / 2, "win_rate_first": win1.astype(float),
             "win_rate_second": win2.astype(float), "tie_rate": ties.astype(float),
             "preference": soft}
    weights = resample_weights(a.size, n_boot, seed)
    out = {"n": int(a.size), "wins": int(wins.sum()), "losses": int(losses.sum()),
           "ties": int(ties.sum())}
    for name, u in units.items():
        out[name] = {"value": float(u.mean()),
                     "ci": percentile_interval(weights @ u / a.size, level)}
    lc = [_logistic_intercept(soft, x, w) for w in weights]
    out["lc_win_rate"] = {"value": float(_logistic_intercept(soft, x, np.ones_like(x))),
                          "ci": percentile_interval(lc, level)}
    return out


def pass_at_1_summary(passed, n_boot: int = 1000, seed: int = 0, level: float = 0.95):
    """{"n", "passed", "pass_at_1": {"value", "ci"}} of one sample per problem."""
    p = np.asarray(passed, np.float64)
    if p.size == 0:
        raise ValueError("no HumanEval problems were run")
    reps = resample_weights(p.size, n_boot, seed) @ p / p.size
    return {"n": int(p.size), "passed": int(p.sum()),
            "pass_at_1": {"value": float(p.mean()), "ci": percentile_interval(reps, level)}}


def eval_key(seed: int) -> jax.Array:
    """The sampler key of the policy's answers (the same for every policy compared)."""
    return jax.random.fold_in(jax.random.PRNGKey(seed), 104_729)


def reference_of(record) -> str:
    """The reference answer of a data row: its "reference" field, else (a ranked row) its
    gold-best response.

    Raises:
        ValueError: neither exists ("<file>:<line>: field 'reference' ...").
    """
    if record.reference:
        return record.reference
    if record.responses and record.ranking:
        return record.responses[record.ranking[0]]
    raise ValueError(f"{record.path}:{record.line}: field 'reference' is missing and the row "
                     "has no ranked responses to take the best one from")


def load_prompt_rows(path: str, max_rows: int, seed: int) -> list:
    """Rows of one prompt file with their references (`reference_of`): all, or a seeded
    random subset of max_rows kept in file order (seeded by the seed and the file's last
    two path parts, as the evaluator benchmark's rows)."""
    import os
    import zlib

    from drubric_jax import data

    records = data.load_jsonl(path)
    for r in records:
        reference_of(r)  # every row has one, before any model loads
    if max_rows and len(records) > max_rows:
        name = "/".join(os.path.normpath(path).split(os.sep)[-2:])
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        keep = sorted(rng.choice(len(records), max_rows, replace=False).tolist())
        records = [records[i] for i in keep]
    return records


def _fmt(x: dict) -> str:
    lo, hi = x["ci"]
    return f"{x['value']:.3f} [{lo:.3f}, {hi:.3f}]"


def results_markdown(report: dict) -> str:
    """results.md of experiments/eval_policy.py from its report.json: the win-rate table
    (per file and all) and the HumanEval line."""
    c = report["config"]
    lines = ["# Policy evaluation", "", f"- command: `{report['command']}`",
             f"- policy: `{c['policy_model']}`; judge: `{c['judge_model']}` (pairwise "
             "yes/no question, both orders); answers at temperature "
             f"{c['temperature']} (0 = greedy), seed {c['seed']}",
             f"- wall time: {report['wall_s'] / 60:.1f} min"]
    if "winrate" in report:
        lines += ["", "| prompts | n | win rate | policy first | policy second | tie rate | "
                  "preference | length-controlled | answer / reference chars |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, s in report["winrate"].items():
            lines.append(
                f"| {name} | {s['n']} | {_fmt(s['win_rate'])} | {_fmt(s['win_rate_first'])} | "
                f"{_fmt(s['win_rate_second'])} | {_fmt(s['tie_rate'])} | "
                f"{_fmt(s['preference'])} | {_fmt(s['lc_win_rate'])} | "
                f"{s['mean_answer_chars']:.0f} / {s['mean_reference_chars']:.0f} |")
        lines += ["", "Win: both orders prefer the policy; tie: the orders disagree. 95% CIs: "
                  "percentile bootstrap over prompts."]
    if "humaneval" in report:
        h = report["humaneval"]
        lines += ["", f"HumanEval pass@1: {_fmt(h['pass_at_1'])} ({h['passed']} of {h['n']} "
                  f"problems, the first {h['n']} of 164; greedy answers of <= "
                  f"{c['humaneval_max_new_tokens']} tokens, {c['timeout_s']} s per test run, "
                  f"sandbox isolation: {h['isolation']})."]
    return "\n".join(lines) + "\n"
