"""Judges of the evaluator benchmark: scores per response from the frozen verifier.

- rubric judges (dynamic, static; METHOD 6): `rubric_samples` asks the verifier every
  item of every sampled list for every response in one pass and scores them with Eq. 12
  under each verdict variant (`verdict_variants`: hard and soft verdicts, METHOD 12, of
  the raw and optionally of the contextually calibrated P(yes),
  `p_yes_raw_and_contextual`).
- random (sanity floor): `random_samples`, uniform scores keyed by the seed and row id.
- direct judges (METHOD 7): `direct_scores`, the verifier's P(yes) to "is this a
  high-quality response?" (optionally shown the whole set: direct_set);
  `pairwise_scores`, "is A better than B?" asked in both orders on pair rows, read as
  three score variants by `pairwise_variants`.

Axis legend (docs/CONVENTIONS.md): K responses per row, M rubric items per list; n is
the number of samples (AVG@n). A row is a `benchmark.Row` (rec, responses, k).
"""
from __future__ import annotations

import zlib

import jax
import numpy as np

from drubric_jax.rl import rewards
from drubric_jax.text.budget import fit_prompt
from drubric_jax.text.prompts import direct_judge_messages, pairwise_judge_messages
from drubric_jax.evaluator.verdicts import (NULL_RESPONSE, VERDICT_MODES, contextual_calibration,
                                  verdicts_from_p_yes)
from drubric_jax.evaluator.shares import judge_shares

RUBRIC_METHODS = ("dynamic", "static")
PAIRWISE_VARIANTS = ("direct_pairwise_ab", "direct_pairwise_ba", "direct_pairwise_avg")


def fitted_ids(verifier, make_messages, prompt, history, responses, max_tokens) -> list:
    """Token ids of a judge prompt whose texts are cut to `max_tokens` (`fit_prompt`).

    Args:
        verifier: a `verifier.Verifier` (its tokenizer and chat template).
        make_messages: (prompt, history, responses) -> chat messages.
        prompt, history, responses: the texts the budget may cut.
        max_tokens: the judge prompt's budget.
    """
    def render(p, h, r):
        return verifier.tokenizer.encode(verifier.render(make_messages(p, h, r)),
                                         add_special_tokens=False)

    return fit_prompt(verifier.tokenizer, render, prompt, history, responses,
                      max_tokens=max_tokens).ids


def direct_scores(verifier, params, rows, max_tokens, with_set: bool):
    """P(yes) per response of the pointwise judge (optionally shown the set), per row.

    Returns:
        list over rows of float[K] (the row's P(yes) per response).
    """
    width = max((row.k for row in rows), default=0)

    def judge(share, _):  # float32[R_p, K_max]: this process's share of the rows
        prompts, spans = [], []
        for row in share:
            start = len(prompts)
            for i in range(row.k):
                # The response judged is the last text; with the set, the K responses
                # precede it.
                def make(p, h, r):
                    return direct_judge_messages(p, r[-1], h, r[:-1] if with_set else None)

                texts = (row.responses if with_set else []) + [row.responses[i]]
                prompts.append(fitted_ids(verifier, make, row.rec.prompt, row.rec.history,
                                          texts, max_tokens))
            spans.append((start, len(prompts)))
        p = verifier.p_yes_ids(params, prompts, process_rows=True)
        out = np.zeros((len(share), width), np.float32)
        for j, (a, b) in enumerate(spans):
            out[j, :b - a] = p[a:b]
        return out

    # Under several processes each renders and tokenises only its share of the rows.
    got = (judge(rows, None) if jax.process_count() == 1
           else judge_shares(lambda cols, st: judge(cols[0], st), [list(rows)], width))
    return [got[j, :row.k] for j, row in enumerate(rows)]


def pairwise_p_yes(verifier, params, questions, max_tokens) -> np.ndarray:
    """The pairwise judge's P(yes) to "is Response A better than Response B?" per question.

    Args:
        verifier, params: a `verifier.Verifier` and its params.
        questions: N (prompt, history, response A, response B) tuples.
        max_tokens: the judge prompt's budget (texts cut by `fitted_ids`).

    Returns:
        float32[N].
    """
    def make(p, h, r):
        return pairwise_judge_messages(p, r[0], r[1], h)

    def judge(qs, _):  # under several processes, each renders and tokenises its share
        return verifier.p_yes_ids(params, [fitted_ids(verifier, make, p, h, [a, b], max_tokens)
                                           for p, h, a, b in qs], process_rows=True)

    if not questions:
        return np.zeros((0,), np.float32)
    if jax.process_count() == 1:
        return judge(questions, None)
    return judge_shares(lambda cols, st: judge(cols[0], st), [list(questions)], 1)[:, 0]


def pairwise_scores(verifier, params, rows, max_tokens):
    """(P(yes | A=resp0, B=resp1), P(yes | A=resp1, B=resp0)) per pair row, else None.

    Returns:
        list over rows: a (float, float) tuple for rows with K = 2, None for the others.
    """
    questions, where = [], []
    for j, row in enumerate(rows):
        if row.k != 2:
            continue
        for a, b in ((0, 1), (1, 0)):
            questions.append((row.rec.prompt, row.rec.history, row.responses[a],
                              row.responses[b]))
        where.append(j)
    out = [None] * len(rows)
    p = pairwise_p_yes(verifier, params, questions, max_tokens)
    for n, j in enumerate(where):
        out[j] = (float(p[2 * n]), float(p[2 * n + 1]))
    return out


def pairwise_variants(p_ab, p_ba) -> dict:
    """Scores (resp 0, resp 1) per pair row of the three readings of the pairwise judge.

    Args:
        p_ab: float[R], P(A better) with A = resp 0; p_ba: float[R], with A = resp 1.

    Returns:
        {name: list of R (score 0, score 1)} for the names in PAIRWISE_VARIANTS: ab reads
        the first order only, ba the second, avg the mean of both.
    """
    return dict(zip(PAIRWISE_VARIANTS, (
        [(a, 1 - a) for a in p_ab],
        [(1 - b, b) for b in p_ba],
        [((a + 1 - b) / 2, (1 - a + b) / 2) for a, b in zip(p_ab, p_ba)],
    )))


def first_position_win_rate(p_ab, p_ba) -> float:
    """Fraction of both orders in which the response shown as A wins (position bias)."""
    p_ab, p_ba = np.asarray(p_ab), np.asarray(p_ba)
    return float(np.mean(np.concatenate([p_ab > 0.5, p_ba > 0.5])))


def p_yes_raw_and_contextual(verifier, params, prompts, responses, items, histories,
                             groups, calibrate: bool, stats=None):
    """P(yes) of every (row, item), and its contextual calibration, from ONE verifier pass.

    `Verifier.p_yes(calibration="contextual")` returns only the calibrated values; here the
    raw ones are wanted too (hard and soft verdicts of both, METHOD 12). Rows in the same
    group share (prompt, history, items) and so one content-free row: (prompt,
    `verdicts.NULL_RESPONSE`, items, history), appended to the same call, as `Verifier`
    does per distinct prompt (tests check the values agree).

    Args:
        verifier, params: a `verifier.Verifier` and its params; stats: its counters.
        prompts, responses: R strings each; items: R lists of item texts ("" = padding);
        histories: R history lists.
        groups: R hashables; rows of one group must have the same prompt, history, items.
        calibrate: False skips the content-free rows (calibrated is then None).

    Returns:
        (raw float32[R, M_max], calibrated float32[R, M_max] or None); 0 at padding.

    Raises:
        ValueError: rows of one group differ in prompt, history or items.
    """
    r = len(responses)
    first: dict = {}  # group -> its first row
    for i, g in enumerate(groups):
        j = first.setdefault(g, i)
        if (prompts[j], histories[j], items[j]) != (prompts[i], histories[i], items[i]):
            raise ValueError(f"rows {j} and {i} of group {g!r} differ in prompt, history "
                             "or items")
    null = list(first.values()) if calibrate else []
    p = verifier.p_yes(params, list(prompts) + [prompts[i] for i in null],
                       list(responses) + [NULL_RESPONSE] * len(null),
                       list(items) + [items[i] for i in null],
                       list(histories) + [histories[i] for i in null], stats=stats)
    raw = p[:r]
    if not calibrate:
        return raw, None
    null_row = {g: r + n for n, g in enumerate(first)}
    cal = contextual_calibration(raw, p[[null_row[g] for g in groups]])
    real = np.zeros(raw.shape, bool)
    for i, lst in enumerate(items):
        real[i, :len(lst)] = [bool(t.strip()) for t in lst]
    return raw, np.where(real, cal, 0.0).astype(np.float32)


def verdict_variants(calibrate: bool) -> tuple:
    """Suffixes of the scores one rubric list gives from one verifier pass (METHOD 12):
    hard and soft verdicts of the raw P(yes), and with calibration of the calibrated one."""
    return ("hard", "soft") + (("hard_ctx", "soft_ctx") if calibrate else ())


def rubric_samples(verifier, params, rows, lists: dict, n: int, calibrate: bool = False,
                   stats=None) -> list:
    """Verifier answers and Eq. 12 scores of every sampled rubric list (METHOD 6, 12).

    Args:
        verifier: a `verifier.Verifier`; params: its params; stats: its counters (dict).
        rows: the R rows to score.
        lists: {method: the generator's lists for these rows (`RubricGenerator`), row i's
            n lists at index i}.
        n: lists per row and method.
        calibrate: also score with contextually calibrated P(yes) (one content-free row
            per row, in the same verifier call).

    Returns:
        list over rows of {method: list of n sample dicts}; a sample holds variant_scores
        {variant: float64[K]} for `verdict_variants` (Eq. 12 with v = hard or soft
        verdicts), the shown response order, the kept items, p_yes [K][M] (and p_yes_ctx),
        the hard verdicts [K][M], and the list's validity, finish reason, raw text and
        cut responses.
    """
    prompts, resps, items, hists, groups, columns = [], [], [], [], [], []
    for j, r in enumerate(rows):
        # P(yes) depends only on (response, item text): score each distinct text of
        # the row once, for every method and sample.
        uniq = {}
        for m in lists:
            for s in range(n):
                for t in lists[m].texts[j][s]:
                    if t.strip():
                        uniq.setdefault(t.strip(), len(uniq))
        columns.append(uniq)
        for y in r.responses:
            prompts.append(r.rec.prompt)
            resps.append(y)
            items.append(list(uniq))
            hists.append(r.rec.history)
            groups.append(j)
    raw, cal = p_yes_raw_and_contextual(verifier, params, prompts, resps, items, hists, groups,
                                        calibrate, stats)
    out, at = [], 0
    for j, r in enumerate(rows):
        p_row = [raw[at:at + r.k]] + ([cal[at:at + r.k]] if calibrate else [])
        at += r.k
        out.append({m: [_sample(lst, j, s, r.k, p_row, columns[j]) for s in range(n)]
                    for m, lst in lists.items()})
    return out


def random_samples(seed: int, row, n: int) -> list:
    """n sample dicts {"scores": float64[K]} of uniform random scores (the sanity floor).

    The key is the config seed folded with the row id's CRC32, so a row's scores do not
    depend on which other rows or methods are evaluated.
    """
    rk = jax.random.fold_in(jax.random.fold_in(
        jax.random.PRNGKey(seed), zlib.crc32(row.rec.id.encode())), 7)
    return [{"scores": np.asarray(jax.random.uniform(jax.random.fold_in(rk, s), (row.k,)),
                                  np.float64)}
            for s in range(n)]


def _sample(lst, j, s, k, p_row, column) -> dict:
    """One sample dict of `rubric_samples`: list s of row j; p_row holds the row's raw
    P(yes) columns (and its calibrated ones)."""
    w, mask = lst.weights[j, s], lst.item_mask[j, s]
    m_real = int(mask.sum())
    grids = []  # raw (and calibrated) P(yes) float32[K, M] of this list's items
    for p_src in p_row:
        p = np.zeros((k, len(w)), np.float32)
        for col, t in enumerate(lst.texts[j][s]):
            if t.strip():
                p[:, col] = p_src[:, column[t.strip()]]
        grids.append(p)
    scores = {}
    for name, p in zip(("", "_ctx"), grids):
        for mode in VERDICT_MODES:
            sc, _ = rewards.rubric_scores(verdicts_from_p_yes(p, mode), w, mask)
            scores[mode + name] = np.asarray(sc, np.float64)
    out = {
        "variant_scores": scores,
        "order": lst.orders[j, s, :k].tolist(),
        "items": [[t, int(wt)] for t, wt, ok in zip(lst.texts[j][s], w, mask) if ok],
        "p_yes": grids[0][:, :m_real].round(4).tolist(),
        "verdicts": verdicts_from_p_yes(grids[0][:, :m_real]).astype(int).tolist(),
        "valid": bool(lst.list_valid[j, s]),
        "finish_reason": lst.finish_reasons[j][s],
        "raw_text": lst.raw_texts[j][s],
        "responses_cut": lst.response_cut[j, s, :k].tolist(),
    }
    if len(grids) > 1:
        out["p_yes_ctx"] = grids[1][:, :m_real].round(4).tolist()
    return out
