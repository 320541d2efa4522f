"""IFEval scores of responses (Zhou et al. 2023, arXiv:2311.07911, Section 3 / Table 2).

Prompt-level accuracy: the fraction of prompts all of whose instructions are followed.
Instruction-level accuracy: the fraction of all instructions followed. Each strict (the
checker on the response) or loose (any of IFEval's eight response variants passes; see
`checks.verify`). The checkers are if-verifiable's (`drubric_jax.checks`).

Instructions that cannot be scored (a check with `checks.CHECKS[id].scorable` False, or
kwargs that fail `checks.validate`: rows 1122 and 1129, see `judge`) are counted and left
out of every denominator: a prompt is judged on its scored instructions, and a prompt with
none is left out of prompt-level accuracy. The two punkt checks are scored, with nltk's
tokenizer and the model `checks.punkt` provides offline. The 95% CIs are
percentile bootstraps over prompts (`intervals.resample_weights`, seeded), so both levels
resample the same prompts. `per_prompt` keeps the per-prompt counts those ratios are
made of (report.json's "per_prompt"), so that accuracies pooled over several runs
(`evaluation.ifeval_seeds`) are recomputed from them.

Axis legend (docs/CONVENTIONS.md): here U prompts, Bt bootstrap replicates.
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from drubric_jax import checks
from drubric_jax.evaluation import intervals

IFEVAL_N_PROMPTS, IFEVAL_N_INSTRUCTIONS = 541, 834  # the upstream input_data.jsonl
METRICS = ("prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose")


def default_data_path(repo_root: str) -> str:
    """../shared/data/ifeval/input_data.jsonl relative to the repository root."""
    return os.path.normpath(os.path.join(repo_root, "..", "shared", "data", "ifeval",
                                         "input_data.jsonl"))


def read_rows(path: str, limit: int | None = None) -> list:
    """The IFEval rows ({"key", "prompt", "instruction_id_list", "kwargs"}) of `path`.

    Raises:
        FileNotFoundError: no file at `path` (the message says where it comes from).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"IFEval prompts not found at {path}: expected the upstream input_data.jsonl "
            "(541 prompts) in ../shared/data/ifeval/ beside the repository")
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return rows[:limit] if limit else rows


def judge(rows, responses) -> list:
    """Per-instruction verdicts: for prompt u, a list of (check, scored, strict, loose, why).

    An instruction is not scored (scored False, strict / loose None, `why` the reason) when
    its check is not scorable here, or when its kwargs fail `checks.validate`: two
    IFEval rows (keys 1122, 1129) give `letter` "#" and "!", for which IFEval's checker
    silently draws a random letter from Python's `random`, so their verdict is not defined.

    Args:
        rows: U IFEval rows; responses: U response strings, in the same order.

    Returns:
        U lists of (check: str, scored: bool, strict: bool | None, loose: bool | None,
        why: str), why "" when scored.

    Raises:
        ValueError: len(rows) != len(responses).
    """
    if len(rows) != len(responses):
        raise ValueError(f"{len(rows)} rows but {len(responses)} responses")
    out = []
    for row, y in zip(rows, responses):
        per = []
        for cid, kw in zip(row["instruction_id_list"], row["kwargs"]):
            kw = {k: v for k, v in kw.items() if v is not None}
            try:
                c = checks.verify.scorable_checker(cid, kw)
            except checks.InvalidCheck as e:  # NotScorable included
                why = "not scorable here" if isinstance(e, checks.NotScorable) else str(e)
                per.append((cid, False, None, None, why))
                continue
            per.append((cid, True, checks.verify.follows(c, y),
                        checks.verify.follows(c, y, loose=True), ""))
        out.append(per)
    return out


def _stat(num, den, w):
    """value and [lo, hi] of sum(num) / sum(den), and over bootstrap weights w[Bt, U]."""
    value = float(intervals.ratio(num.sum(), den.sum()))
    reps = intervals.ratio(w @ num, w @ den)
    return {"value": value, "ci95": intervals.percentile_interval(reps)}


def report(judged, n_boot: int = intervals.N_BOOTSTRAP, seed: int = 0) -> dict:
    """IFEval's four accuracies with bootstrap 95% CIs, per instruction type, not-scored counts
    (the not-scorable checks, and instructions whose kwargs are invalid, listed in
    "invalid_args").

    Args:
        judged: the output of `judge` (U prompts).
        n_boot, seed: bootstrap replicates over prompts and their seed.

    Returns:
        {"n_prompts", "n_instructions", "not_scored": {"count", "of", "by_check",
        "invalid_args", "prompts_affected", "prompts_without_scorable"}, "metrics": {name: {"value",
        "ci95"}} for `METRICS`, "per_type": {check: {"n", "strict", "loose"}} (scored types;
        strict / loose as {"value", "ci95"} instruction-level within the type)}.

    Raises:
        ValueError: no prompts.
    """
    u = len(judged)
    w = intervals.resample_weights(u, n_boot, seed)  # raises ValueError when u == 0
    n_sc, n_ok, has = _counts(judged)
    metrics = {}
    for m in ("strict", "loose"):
        metrics[f"prompt_{m}"] = _stat(has * (n_ok[m] == n_sc), has, w)
        metrics[f"instruction_{m}"] = _stat(n_ok[m], n_sc, w)
    per_type = {}
    for cid in checks.CHECK_IDS:
        cnt = np.array([sum(v[0] == cid and v[1] for v in p) for p in judged], np.float64)
        if cnt.sum() == 0:
            continue
        ok = {m: np.array([sum(v[0] == cid and bool(v[i]) for v in p) for p in judged],
                          np.float64) for m, i in (("strict", 2), ("loose", 3))}
        per_type[cid] = {"n": int(cnt.sum()), "strict": _stat(ok["strict"], cnt, w),
                         "loose": _stat(ok["loose"], cnt, w)}
    unscored = [v[0] for p in judged for v in p if not v[1]]
    invalid = sorted({v[4] for p in judged for v in p if not v[1] and v[4] != "not scorable here"})
    return {
        "n_prompts": u, "n_instructions": sum(len(p) for p in judged),
        "not_scored": {"count": len(unscored), "of": sum(len(p) for p in judged),
                       "by_check": {c: unscored.count(c) for c in sorted(set(unscored))},
                       "invalid_args": invalid,
                       "prompts_affected": sum(any(not v[1] for v in p) for p in judged),
                       "prompts_without_scorable": int(u - has.sum())},
        "metrics": metrics, "per_type": per_type, "bootstrap": {"n_boot": n_boot, "seed": seed},
    }


def _counts(judged) -> tuple:
    """Per prompt: scored instructions n_sc, followed ones {strict, loose}, has (n_sc > 0),
    float64[U] each (the units of `report`)."""
    n_ok = {m: np.array([sum(bool(v[i]) for v in p if v[1]) for p in judged], np.float64)
            for m, i in (("strict", 2), ("loose", 3))}
    n_sc = np.array([sum(v[1] for v in p) for p in judged], np.float64)
    return n_sc, n_ok, (n_sc > 0).astype(np.float64)


def per_prompt(rows, judged) -> dict:
    """The per-prompt counts that every IFEval accuracy is a ratio of, as report.json keeps
    them (so that accuracies pooled over several runs are recomputed from report.json
    alone: `evaluation.ifeval_seeds`).

    Args:
        rows: U IFEval rows (`read_rows`); judged: `judge` of U responses to them.

    Returns:
        {"key": U IFEval row keys (ints in the upstream file), "scored": U scored
        instructions, "strict" / "loose": U instructions followed (strict / loose)}, the
        counts as lists of int.

    Raises:
        ValueError: len(rows) != len(judged).
    """
    if len(rows) != len(judged):
        raise ValueError(f"{len(rows)} rows but {len(judged)} judged responses")
    n_sc, n_ok, _ = _counts(judged)
    return {"key": [r["key"] for r in rows], "scored": n_sc.astype(int).tolist(),
            "strict": n_ok["strict"].astype(int).tolist(),
            "loose": n_ok["loose"].astype(int).tolist()}


def counts_of(pp: dict) -> tuple:
    """`per_prompt`'s record back as `_counts`' (n_sc, {strict, loose}, has), float64[U]."""
    n_sc = np.asarray(pp["scored"], np.float64)
    n_ok = {m: np.asarray(pp[m], np.float64) for m in ("strict", "loose")}
    return n_sc, n_ok, (n_sc > 0).astype(np.float64)


def file_sha256(path: str) -> str:
    """The hex SHA-256 of a file's bytes (which baseline responses a paired run used)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def paired(judged_before, judged_after, n_boot: int = intervals.N_BOOTSTRAP,
           seed: int = 0) -> dict:
    """The four accuracies of two models' answers to the same prompts (`judge` outputs, same
    rows in the same order) and after - before, with a paired percentile-bootstrap 95% CI
    (the same prompt resamples for both: each replicate's difference of the two ratios).

    Returns:
        {"n_prompts", metric: {"before", "after", "difference", "ci95"}} for `METRICS`.

    Raises:
        ValueError: different prompt counts, or different scored instructions per prompt
            (the two were judged on different rows).
    """
    if len(judged_before) != len(judged_after):
        raise ValueError(f"paired IFEval needs the same prompts: {len(judged_before)} vs "
                         f"{len(judged_after)}")
    return paired_counts(_counts(judged_before), _counts(judged_after), n_boot, seed)


def paired_counts(before, after, n_boot: int = intervals.N_BOOTSTRAP, seed: int = 0) -> dict:
    """`paired` on per-prompt counts (`_counts` or `counts_of`: (n_sc, {strict, loose}, has),
    float64[U] each, the same U prompts in the same order).

    Prompt level: the fraction of prompts with a scored instruction that follow all of
    them; instruction level: followed / scored instructions, so a resample weighs each
    drawn prompt by its scored instructions (as `report`). Replicate b's difference is
    ratio(w_b @ num_after, w_b @ den) - ratio(w_b @ num_before, w_b @ den), w =
    `intervals.resample_weights(U, n_boot, seed)`.

    Returns:
        `paired`'s dict.

    Raises:
        ValueError: different prompt counts, or different scored instructions per prompt.
    """
    sc_b, sc_a = before[0], after[0]
    if sc_b.shape != sc_a.shape:
        raise ValueError(f"paired IFEval needs the same prompts: {sc_b.size} vs {sc_a.size}")
    if not np.array_equal(sc_b, sc_a):
        raise ValueError("paired IFEval: the two runs scored different instructions per prompt")
    w = intervals.resample_weights(sc_b.size, n_boot, seed)
    out = {"n_prompts": int(sc_b.size)}
    terms_b, terms_a = metric_terms(before), metric_terms(after)
    for k, (num_b, den) in terms_b.items():
        num_a = terms_a[k][0]
        before_v = float(intervals.ratio(num_b.sum(), den.sum()))
        after_v = float(intervals.ratio(num_a.sum(), den.sum()))
        reps = intervals.ratio(w @ num_a, w @ den) - intervals.ratio(w @ num_b, w @ den)
        out[k] = {"before": before_v, "after": after_v, "difference": after_v - before_v,
                  "ci95": intervals.percentile_interval(reps)}
    return out


def metric_terms(counts) -> dict:
    """Each of `METRICS` as (num, den), float64[U] each, accuracy = sum(num) / sum(den):
    prompt level num = has * [all scored followed], den = has; instruction level num =
    followed, den = scored (the ratios of `report` and `paired_counts`).

    Args:
        counts: (n_sc, {strict, loose}, has) of `_counts` / `counts_of`.
    """
    n_sc, n_ok, has = counts
    out = {}
    for m in ("strict", "loose"):
        out[f"prompt_{m}"] = (has * (n_ok[m] == n_sc), has)
        out[f"instruction_{m}"] = (n_ok[m], n_sc)
    return out


def format_paired(p: dict, before: str, after: str) -> str:
    """The paired comparison as text lines (after - before, 95% CI)."""
    lines = [f"paired over {p['n_prompts']} prompts: {after} - {before}",
             f"{'metric':<22}{'before':<10}{'after':<10}after - before [95% CI]"]
    for m in METRICS:
        x = p[m]
        lo, hi = x["ci95"]
        lines.append(f"{m:<22}{x['before']:<10.3f}{x['after']:<10.3f}"
                     f"{x['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    return "\n".join(lines)


def format_table(rep: dict) -> str:
    """The report as text lines: the four accuracies, not-scored counts, per-type rows."""
    def cell(s):
        return f"{s['value']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]"
    ns = rep["not_scored"]
    lines = [f"IFEval: {rep['n_prompts']} prompts, {rep['n_instructions']} instructions; "
             f"not scored: {ns['count']} of {ns['of']} ({ns['by_check']}), left out of the "
             f"denominators; {ns['prompts_without_scorable']} prompts with no scored instruction",
             f"{'metric':<22}{'strict':<26}loose"]
    for level in ("prompt", "instruction"):
        m = rep["metrics"]
        lines.append(f"{level + '-level':<22}{cell(m[level + '_strict']):<26}"
                     f"{cell(m[level + '_loose'])}")
    lines.append(f"{'per type (n)':<50}{'strict':<26}loose")
    for cid, t in rep["per_type"].items():
        name = f"{cid} ({t['n']})"
        lines.append(f"{name:<50}{cell(t['strict']):<26}{cell(t['loose'])}")
    return "\n".join(lines)


def read_responses(path: str, rows) -> list:
    """The responses of a {"prompt", "response"} JSONL whose prompts are rows[:n] in order.

    Raises:
        ValueError: a prompt differs from the data's (naming the line), or more responses
            than rows.
    """
    with open(path, encoding="utf-8") as f:
        got = [json.loads(line) for line in f if line.strip()]
    if len(got) > len(rows):
        raise ValueError(f"{path}: {len(got)} responses but {len(rows)} IFEval rows")
    for i, (g, row) in enumerate(zip(got, rows)):
        if g["prompt"] != row["prompt"]:
            raise ValueError(f"{path}: line {i + 1}'s prompt is not IFEval row {i}'s")
    return [g["response"] for g in got]


def resume_responses(path: str, rows, generate) -> tuple:
    """Responses to every row, generated into `path` batch by batch so that a killed run
    resumes where the file ends: its complete lines are kept (checked against `rows` in
    order; a partial last line is cut off the file) and only the rows after them are
    generated.

    Args:
        path: the {"prompt", "response", "truncated"} JSONL (created when missing).
        rows: IFEval rows (`read_rows`).
        generate: `(prompts, on_batch) -> (responses, cut)`; it calls
            `on_batch(responses, truncated)` after each batch (appended to `path` at once;
            `truncated` a bool per response, or None when not known) and returns all of
            them with the number cut at the length limit.

    Returns:
        (responses of every row, the number of them cut at the length limit: the file's
        rows count by their "truncated" field; None when a kept row lacks it, as in files
        written before it was recorded).
    """
    done, done_cut = [], 0
    if os.path.exists(path):
        with open(path, "rb") as f:
            data = f.read()
        keep = data[:data.rfind(b"\n") + 1]  # complete lines only
        if len(keep) != len(data):
            with open(path, "wb") as f:
                f.write(keep)
        done = read_responses(path, rows)
        flags = [json.loads(line).get("truncated")
                 for line in keep.decode("utf-8").splitlines() if line.strip()]
        done_cut = None if None in flags else sum(bool(x) for x in flags)
    prompts = [r["prompt"] for r in rows]
    written = [len(done)]

    def append(got, truncated=None):
        with open(path, "a", encoding="utf-8") as f:
            for j, y in enumerate(got):
                row = {"prompt": prompts[written[0]], "response": y}
                if truncated is not None:
                    row["truncated"] = bool(truncated[j])
                f.write(json.dumps(row) + "\n")
                written[0] += 1

    new, cut = generate(prompts[len(done):], append) if len(done) < len(rows) else ([], 0)
    return done + list(new), (None if done_cut is None or cut is None else done_cut + cut)


def results_markdown(rep: dict) -> str:
    """A report.json of `experiments.eval_ifeval` as the markdown of `results/`: the four
    accuracies with CIs and, with a baseline, the paired differences."""
    def cell(x):
        return f"{x['value']:.3f} [{x['ci95'][0]:.3f}, {x['ci95'][1]:.3f}]"

    s, m, ns = rep.get("setup", {}), rep["metrics"], rep["not_scored"]
    command = f"`{rep['command']}`" if rep.get("command") else "(not recorded)"
    lines = ["# IFEval (Zhou et al. 2023)", "", f"- command: {command}",
             f"- model: `{s.get('model') or s.get('responses')}`, {s.get('decoding', 'greedy')}"
             f" decoding, at most {s.get('max_new_tokens')} new tokens "
             + (f"({s['truncated_responses']} answers cut there), "
                if s.get("truncated_responses") is not None
                else "(answers cut there: not recorded), ")
             + 
             f"{s.get('seconds_generate')} s of generation",
             f"- {rep['n_prompts']} prompts, {rep['n_instructions']} instructions; not scored: "
             f"{ns['count']} ({ns['by_check']}), left out of every denominator", "",
             "| level | strict [95% CI] | loose [95% CI] |", "|---|---|---|"]
    for level in ("prompt", "instruction"):
        lines.append(f"| {level} | {cell(m[level + '_strict'])} | "
                     f"{cell(m[level + '_loose'])} |")
    p = rep.get("paired")
    if p:
        moved = [k for k in METRICS if not p[k]["ci95"][0] <= 0 <= p[k]["ci95"][1]]
        lines += ["", "Shown: " + (
            "the model differs from the baseline beyond chance in " + ", ".join(moved)
            if moved else "no difference from the baseline beyond chance in any of the four "
            "accuracies (every paired CI holds 0); a small effect is not ruled out") + "."]
        lines += ["", f"## Paired against `{p.get('baseline')}` (the same prompts; the CI "
                  "resamples prompts for both)", "",
                  "| metric | baseline | this model | difference [95% CI] | 0 inside the CI |",
                  "|---|---|---|---|---|"]
        for k in METRICS:
            x = p[k]
            lo, hi = x["ci95"]
            lines.append(f"| {k} | {x['before']:.3f} | {x['after']:.3f} | "
                         f"{x['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}] | "
                         f"{'yes' if lo <= 0 <= hi else 'no'} |")
    return "\n".join(lines + [""])
