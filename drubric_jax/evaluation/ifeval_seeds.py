"""IFEval of one arm's policies over several seeds, each paired against the same P_0
responses (`experiments.report` writes `ifeval-seeds[-<arm>].md`; METHOD 15).

A run is an `experiments.eval_ifeval` directory made with --baseline=<P_0 responses.jsonl>.
Its report.json holds the per-prompt counts of both models ("per_prompt" and
"paired.baseline_per_prompt", `ifeval.per_prompt`), the baseline file's SHA-256
("paired.baseline_sha256") and the run's arm and seed ("run", `run_identity`: from
eval_ifeval's --arm / --run_seed, or from a model path `.../seed<S>/<arm>/export/policy`
as `experiments.checks_policy` lays its runs out). A run that says neither (written before
"run" existed, with another model path) is named by its directory; nothing is guessed.

Every run given is a column; none is chosen or dropped by a score. Per seed: the paired
difference to P_0 with that run's percentile bootstrap over prompts (`ifeval.paired_counts`,
as eval_ifeval prints it). Pooled: the mean over the seeds of each seed's accuracy or
difference, with the two-stage bootstrap of METHOD 15 (`intervals.two_stage_ratio`: the
seeds drawn with replacement, then the prompt ids once per replicate for all the drawn
seeds, since every seed answers the same prompts). Each accuracy is a ratio of per-prompt
sums (`ifeval.metric_terms`): prompt level counts the drawn prompts that have a scored
instruction, instruction level weighs each drawn prompt by its scored instructions, as
the single-run intervals do. Beside a pooled difference whose interval holds 0, the
smallest difference the design detects (`intervals.minimal_detectable`).

Axis legend (docs/CONVENTIONS.md): here S seeds (runs of one arm), U prompts (the same U
for every seed), Bt bootstrap replicates.
"""
from __future__ import annotations

import json
import os
import re

import numpy as np

from drubric_jax.evaluation import ifeval, intervals

POOLED = intervals.two_stage_name("prompts")
# experiments.checks_policy exports a policy at <workdir>/seed<S>/<arm>/export/policy.
_RUN_PATH = re.compile(r"(?:^|/)seed(\d+)/([^/]+)/export/policy$")
# Setup fields that must agree between the runs of one arm that generated their answers.
_SAME_SETUP = ("decoding", "max_new_tokens", "dtype")


def arm_and_seed_from_path(model) -> tuple:
    """(arm, seed) of a model path laid out as `experiments.checks_policy` exports a policy,
    `<workdir>/seed<S>/<arm>/export/policy`; (None, None) for any other path or None."""
    if not model:
        return None, None
    found = _RUN_PATH.search(os.path.normpath(str(model)).replace(os.sep, "/"))
    return (found.group(2), int(found.group(1))) if found else (None, None)


def run_identity(model, arm: str = "", seed=None) -> dict:
    """The arm and seed of the policy an IFEval run scores (report.json's "run").

    Args:
        model: eval_ifeval's --model (None when it scored a --responses file).
        arm: --arm ("" when not given); seed: --run_seed (None when not given).

    Returns:
        {"arm": str | None, "seed": int | None, "source": {"arm", "seed"}: "flag", "model
        path" or None (not known)}.

    Raises:
        ValueError: a flag that contradicts the model path (naming both).
    """
    p_arm, p_seed = arm_and_seed_from_path(model)
    for flag, given, parsed in (("--arm", arm or None, p_arm), ("--run_seed", seed, p_seed)):
        if given is not None and parsed is not None and given != parsed:
            raise ValueError(f"{flag}={given} contradicts the model path {model} (its "
                             f".../seed<S>/<arm>/export/policy says {parsed})")

    def pick(given, parsed):
        if given is not None:
            return given, "flag"
        return (parsed, "model path") if parsed is not None else (None, None)

    (a, a_src), (s, s_src) = pick(arm or None, p_arm), pick(seed, p_seed)
    return {"arm": a, "seed": s, "source": {"arm": a_src, "seed": s_src}}


def _read_report(run_dir: str) -> tuple:
    """(path, contents) of a run directory's report.json."""
    path = os.path.join(run_dir, "report.json")
    with open(path, encoding="utf-8") as f:
        return path, json.load(f)


def identity_of(run_dir: str, rep: dict) -> dict:
    """The arm and seed of an IFEval run: report.json's "run", or for a report.json
    written before it, what setup.model's path says (`arm_and_seed_from_path`).

    Returns:
        `run_identity`'s dict plus "name" (the directory's name) and "label" ("seed S", or
        the directory's name when the seed is not known).
    """
    ident = rep.get("run") or run_identity((rep.get("setup") or {}).get("model"))
    name = os.path.basename(os.path.normpath(run_dir))
    return {**ident, "name": name,
            "label": f"seed {ident['seed']}" if ident["seed"] is not None else name}


def paired_runs_by_arm(run_dirs) -> dict:
    """{arm (None: not known): [its run directories, in the order given]} of the IFEval run
    directories whose report.json holds a paired comparison (eval_ifeval --baseline); the
    others (P_0's own run) are left out."""
    out: dict = {}
    for d in run_dirs:
        _, rep = _read_report(d)
        if "paired" in rep:
            out.setdefault(identity_of(d, rep)["arm"], []).append(d)
    return out


def load_run(run_dir: str) -> dict:
    """One paired IFEval run's per-prompt counts and identity, from its report.json.

    Returns:
        {"dir", "name", "arm", "seed", "source", "label" (`identity_of`), "after" /
        "before": per-prompt records of the run and its baseline (`ifeval.per_prompt`),
        "baseline" (the path as given), "baseline_sha256", "bootstrap": {"n_boot",
        "seed"}, "setup", "command"}.

    Raises:
        ValueError: report.json without "paired" (not given --baseline), or without the
            per-prompt counts (written before they were kept), naming the file and field
            and how to rescore without a model.
    """
    path, rep = _read_report(run_dir)
    rescore = (f"rescore its answers without a model: python -m experiments.eval_ifeval "
               f"--responses={os.path.join(run_dir, 'responses.jsonl')} "
               "--baseline=<P_0 responses.jsonl> --arm=<arm> --run_seed=<seed> --out=<new dir>")
    p = rep.get("paired")
    if p is None:
        raise ValueError(f"{path}: no \"paired\" field (the run was not given "
                         "--baseline=<P_0 responses.jsonl>); " + rescore)
    for where, field in ((rep, "per_prompt"), (p, "baseline_per_prompt"),
                         (p, "baseline_sha256")):
        if field not in where:
            name = field if where is rep else f"paired.{field}"
            raise ValueError(f"{path}: no \"{name}\" field (written before eval_ifeval kept "
                             "per-prompt counts); " + rescore)
    setup = rep.get("setup") or {}
    ident = identity_of(run_dir, rep)
    return {"dir": run_dir, **{k: ident[k] for k in ("name", "arm", "seed", "source",
                                                     "label")},
            "after": rep["per_prompt"], "before": p["baseline_per_prompt"],
            "baseline": p.get("baseline"), "baseline_sha256": p["baseline_sha256"],
            "bootstrap": rep.get("bootstrap", {"n_boot": intervals.N_BOOTSTRAP, "seed": 0}),
            "setup": setup, "command": rep.get("command", "")}


def seeds_file_name(arm) -> str:
    """`ifeval-seeds.md` for runs whose arm is not known, else `ifeval-seeds-<arm>.md`."""
    if arm is None:
        return "ifeval-seeds.md"
    return f"ifeval-seeds-{re.sub(r'[^A-Za-z0-9_.-]', '_', str(arm))}.md"


def check_same_design(runs) -> None:
    """Refuses runs of one arm that cannot be pooled: two with the same label (arm and
    seed, or directory name), paired against different baseline files (by SHA-256), on
    other prompts or other scored instructions, with a baseline scored differently, or
    generated with other decoding settings (`_SAME_SETUP`).

    Raises:
        ValueError: naming the run directories that differ (for the baseline: each run
            whose baseline file is not the one most runs were paired against) and the
            field.
    """
    if len(runs) < 2:
        raise ValueError(f"pooling needs two or more runs; got {[r['dir'] for r in runs]}")
    seen: dict = {}
    for r in runs:
        if r["label"] in seen:
            raise ValueError(f"{seen[r['label']]} and {r['dir']} are both {r['label']!r} of "
                             f"arm {r['arm']!r}: give each seed once")
        seen[r["label"]] = r["dir"]
    by_sha: dict = {}
    for r in runs:
        by_sha.setdefault(r["baseline_sha256"], []).append(r)
    if len(by_sha) > 1:
        main = max(by_sha.values(), key=len)  # ties: the first run's baseline
        odd = [r for r in runs if r["baseline_sha256"] != main[0]["baseline_sha256"]]
        raise ValueError(
            "; ".join(f"{r['dir']}/report.json: paired.baseline {r['baseline']} (sha256 "
                      f"{r['baseline_sha256'][:12]})" for r in odd)
            + f" is not the P_0 responses file of {', '.join(r['dir'] for r in main)} "
            f"({main[0]['baseline']}, sha256 {main[0]['baseline_sha256'][:12]}): every seed "
            "of an arm must be paired against the same baseline file")
    for r in runs:
        if r["after"]["scored"] != r["before"]["scored"]:
            raise ValueError(f"{r['dir']}/report.json: per_prompt.scored differs from "
                             "paired.baseline_per_prompt.scored")
    first = runs[0]
    for r in runs[1:]:
        for field, a, b in (("per_prompt.key", first["after"]["key"], r["after"]["key"]),
                            ("per_prompt.scored", first["after"]["scored"],
                             r["after"]["scored"]),
                            ("paired.baseline_per_prompt", first["before"], r["before"])):
            if a != b:
                raise ValueError(f"{r['dir']}/report.json: {field} differs from "
                                 f"{first['dir']}'s (other prompts, --limit or checkers); "
                                 "seeds are pooled on the same prompts only")
        generated = [x for x in (first, r) if x["setup"].get("model")]
        for field in _SAME_SETUP if len(generated) == 2 else ():
            if first["setup"].get(field) != r["setup"].get(field):
                raise ValueError(f"{r['dir']}/report.json: setup.{field} = "
                                 f"{r['setup'].get(field)!r}, {first['dir']}'s is "
                                 f"{first['setup'].get(field)!r}: seeds of one arm are "
                                 "decoded alike")


def summarize(runs, n_boot: int | None = None, seed=None, level: float = 0.95) -> dict:
    """Per-seed and pooled IFEval accuracies of one arm's runs and their differences to P_0.

    Args:
        runs: S >= 2 `load_run` outputs of one arm, paired against the same P_0 responses
            (`check_same_design` is applied).
        n_boot, seed: the pooled bootstrap's replicates and numpy seed (default: the first
            run's report.json "bootstrap"); each seed's own paired CI uses its run's.
        level: the pooled intervals' coverage.

    Returns:
        {"arm", "runs": [{"label", "dir", "arm", "seed", "source", "model", "command",
        "truncated", "paired": `ifeval.paired_counts` with the run's bootstrap}],
        "baseline", "baseline_sha256", "n_prompts": U, "n_prompts_scored" (with a scored
        instruction), "n_instructions_scored", "p0": {metric: {"value", "ci95"}} (P_0's
        accuracy, percentile bootstrap over prompts), "levels" / "differences": {metric:
        `intervals.two_stage_ratio`} (the policy's accuracy, and policy - P_0, pooled over
        the seeds), "n_boot", "seed", "level", "interval": `POOLED`}, metrics in
        `ifeval.METRICS` order.

    Raises:
        ValueError: `check_same_design`'s.
    """
    check_same_design(runs)
    first = runs[0]
    n_boot = int(first["bootstrap"]["n_boot"] if n_boot is None else n_boot)
    seed = first["bootstrap"]["seed"] if seed is None else seed
    before = ifeval.counts_of(first["before"])
    afters = [ifeval.counts_of(r["after"]) for r in runs]
    keys = [list(r["after"]["key"]) for r in runs]                       # S x [U]
    terms_b = ifeval.metric_terms(before)
    terms_a = [ifeval.metric_terms(a) for a in afters]
    u = before[0].size
    w = intervals.resample_weights(u, n_boot, seed)                      # [Bt, U]
    p0, levels, diffs = {}, {}, {}
    for k in ifeval.METRICS:
        num_b, den = terms_b[k]
        p0[k] = {"value": float(intervals.ratio(num_b.sum(), den.sum())),
                 "ci95": intervals.percentile_interval(
                     intervals.ratio(w @ num_b, w @ den), level)}
        # One seed int for every call: each metric sees the same two-stage replicates.
        levels[k] = intervals.two_stage_ratio([t[k][0] for t in terms_a], [den] * len(runs),
                                              n_boot, seed, level, ids=keys, unit="prompts")
        diffs[k] = intervals.two_stage_ratio([t[k][0] - num_b for t in terms_a],
                                             [den] * len(runs), n_boot, seed, level,
                                             ids=keys, unit="prompts")
    per_run = []
    for r, a in zip(runs, afters):
        b = r["bootstrap"]
        per_run.append({
            "label": r["label"], "dir": r["dir"], "arm": r["arm"], "seed": r["seed"],
            "source": r["source"], "model": r["setup"].get("model") or r["setup"].get(
                "responses"), "command": r["command"],
            "truncated": r["setup"].get("truncated_responses"),
            "max_new_tokens": r["setup"].get("max_new_tokens"),
            "paired": ifeval.paired_counts(before, a, int(b["n_boot"]), b["seed"])})
    return {"arm": first["arm"], "runs": per_run, "baseline": first["baseline"],
            "baseline_sha256": first["baseline_sha256"], "n_prompts": int(u),
            "n_prompts_scored": int(before[2].sum()), "n_instructions_scored":
            int(before[0].sum()), "p0": p0, "levels": levels, "differences": diffs,
            "n_boot": n_boot, "seed": seed, "level": level, "interval": POOLED}


def _ci(x: float, ci, sign: bool = False) -> str:
    f = "{:+.3f}" if sign else "{:.3f}"
    return f"{f.format(x)} [{f.format(ci[0])}, {f.format(ci[1])}]"


def _pooled_diff(d: dict) -> str:
    text = _ci(d["mean"], d["ci"], sign=True)
    if d["zero_inside_ci"] and np.isfinite(d["minimal_detectable"]):
        text += f"; detectable >= {d['minimal_detectable']:.3f}"
    return text


def markdown(s: dict) -> str:
    """`summarize`'s output as the markdown of `results/`: the runs (every one given), the
    four accuracies per seed, of P_0 and pooled, then each seed's difference to P_0 [its
    CI], their mean (sd), how many seeds' CIs lie above / below / around 0, and the pooled
    difference [two-stage CI] (with the smallest detectable difference beside a null)."""
    from drubric_jax.evaluation.checks_policy import seed_spread

    runs, pct = s["runs"], round(100 * s["level"])
    labels = [r["label"] for r in runs]
    arm = f"arm `{s['arm']}`" if s["arm"] is not None else "arm not recorded"
    lines = [f"# IFEval across seeds: {arm}", "",
             f"- {len(runs)} runs, every run given (none chosen by a score): "
             + ", ".join(f"{r['label']} (`{r['dir']}`)" for r in runs) + ".",
             f"- baseline P_0: `{s['baseline']}` (sha256 {s['baseline_sha256'][:12]}), the "
             f"same file for every run; {s['n_prompts']} prompts ({s['n_prompts_scored']} "
             f"with a scored instruction), {s['n_instructions_scored']} scored instructions.",
             f"- Per-seed cells: that run alone; its difference's {pct}% CI is the paired "
             "percentile bootstrap over prompts (the same resample for P_0 and the policy). "
             f"Pooled: the mean over the seeds of each seed's figure, {pct}% CI by a "
             f"{POOLED} ({s['n_boot']} replicates, seed {s['seed']}; METHOD 15: a replicate "
             f"draws the {len(runs)} seeds with replacement, then the {s['n_prompts']} "
             "prompt ids once for all the drawn seeds, since every seed answers the same "
             "prompts). Prompt-level accuracy counts the drawn prompts with a scored "
             "instruction, instruction-level accuracy is followed / scored instructions over "
             "the drawn prompts (as the single-run tables). \"detectable >= x\" beside a "
             "pooled CI that holds 0: the smallest true difference this design detects with "
             "80% power at two-sided 5% (2.8 standard errors of the same bootstrap).", ""]
    moved = [k for k in ifeval.METRICS if not s["differences"][k]["zero_inside_ci"]]
    held = [k for k in ifeval.METRICS if k not in moved]
    lines += ["Shown: " + "; ".join(
        ([f"pooled over the seeds, the policies differ from P_0 beyond the seeds' and "
          f"prompts' spread in {', '.join(moved)}"] if moved else [])
        + ([f"no pooled difference from P_0 beyond chance in {', '.join(held)} (the CI "
            "holds 0; a difference below the detectable size is not ruled out)"]
           if held else [])) + ".", "",
              "## Accuracies", "",
              f"| metric | P_0 [{pct}% CI, prompts] | " + " | ".join(labels)
              + f" | mean (sd) over seeds | pooled [{pct}% CI, {POOLED}] |",
              "|---|---|" + "---|" * len(runs) + "---|---|"]
    for k in ifeval.METRICS:
        vals = [r["paired"][k]["after"] for r in runs]
        sp = seed_spread(vals)
        lv = s["levels"][k]
        lines.append(f"| {k} | {_ci(s['p0'][k]['value'], s['p0'][k]['ci95'])} | "
                     + " | ".join(f"{v:.3f}" for v in vals)
                     + f" | {sp['mean']:.3f} ({sp['sd']:.3f}) | {_ci(lv['mean'], lv['ci'])} |")
    lines += ["", "## Paired differences (policy - P_0)", "",
              "| metric | " + " | ".join(labels) + " | mean (sd) over seeds | "
              f"CI above / below / holding 0 | pooled [{pct}% CI, {POOLED}] |",
              "|---|" + "---|" * len(runs) + "---|---|---|"]
    for k in ifeval.METRICS:
        ds = [r["paired"][k] for r in runs]
        sp = seed_spread([d["difference"] for d in ds])
        above = sum(d["ci95"][0] > 0 for d in ds)
        below = sum(d["ci95"][1] < 0 for d in ds)
        lines.append(f"| {k} | " + " | ".join(_ci(d["difference"], d["ci95"], sign=True)
                                              for d in ds)
                     + f" | {sp['mean']:+.3f} ({sp['sd']:.3f}) | {above} / {below} / "
                     f"{len(ds) - above - below} | {_pooled_diff(s['differences'][k])} |")
    lines += ["", "## Runs", "",
              "| column | run directory | arm, seed (from) | model | answers cut | command |",
              "|---|---|---|---|---|---|"]
    for r in runs:
        src = r["source"]
        ident = (f"{r['arm'] if r['arm'] is not None else '-'} ({src['arm'] or 'not known'}), "
                 f"{r['seed'] if r['seed'] is not None else '-'} "
                 f"({src['seed'] or 'not known'})")
        cut = ("not recorded" if r["truncated"] is None
               else f"{r['truncated']} of {s['n_prompts']} at {r['max_new_tokens']} tokens")
        cmd = f"`{r['command']}`" if r["command"] else "(not recorded)"
        lines.append(f"| {r['label']} | `{r['dir']}` | {ident} | `{r['model']}` | {cut} | "
                     f"{cmd} |")
    return "\n".join(lines + [""])
