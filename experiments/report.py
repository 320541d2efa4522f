r"""Regenerates `results/` (markdown tables with CIs and matplotlib plots) from run
directories of the paper's experiments.

    python -m experiments.report runs/grpo_learns runs/ablation runs/coevo runs/evalp_p0
    python -m experiments.report runs/ablation --out=/tmp/results

Each RUN_DIR is recognised by what it holds, and every number is recomputed from the
files in it (nothing is copied from a previous results/):
    grpo_learns   summary.json with "parts": the learning curves are read again from each
                  part's metrics.jsonl (`evaluation.learning.summarize_parts`)
    ablation      summary.json with "generators": the CIs are recomputed from each
                  generator's heldout.json (`evaluation.ablation.summarize`)
    coevolution   summary.json with "r_disc": recomputed from eval.json
                  (`evaluation.coevolution.summarize`, plot `coevolution.plot`); with
                  "mode": "rounds", from the stages' metrics (`evaluation.coevolution_rounds`)
    checks_policy summary.json with "arms_run": the held-out gold scores and training
                  curves of every arm and seed (`evaluation.checks_policy.summarize`)
    sensitivity   summary.json with "settings": each setting's held-out generator values
                  and policy gold scores (`evaluation.sensitivity.summarize`)
    checks_sft    summary.json of experiments.sft_generator: held-out recovery at each
                  evaluation, recomputed from recovery.jsonl (`evaluation.checks_sft`)
    eval_policy   report.json with "winrate" / "humaneval" (its statistics)
    ifeval        report.json of experiments.eval_ifeval ("metrics" and "not_scored"; with
                  its paired comparison to a baseline when it has one)
    evaluator     report.json with "macro" (the evaluator benchmark,
                  `evaluation.results.results_markdown`)
Writes `<out>/<kind>-<run dir name>.md` (+ `.png` where the kind has a plot) and
`<out>/README.md`, an index naming each file's run directory and command. Given two or more
coevolution run directories (seeds), also `<out>/coevolution-seeds.md`: their headline
differences side by side, their spread and their pooled value
(`evaluation.coevolution.across_seeds`, `coevolution_rounds.across_seeds`); given
two or more ablation run directories, `<out>/ablation-seeds.md`: each generator's metrics
and each paired difference per run, their spread, and the runs' held-out lists pooled by
the two-stage bootstrap, runs then list ids (`evaluation.ablation_seeds`); given two or
more IFEval runs of one arm paired against the same P_0 responses file (eval_ifeval
--baseline), `<out>/ifeval-seeds-<arm>.md` (`ifeval-seeds.md` for runs whose arm is not
recorded): every run's four accuracies and paired differences to P_0, and their pooled
values by the two-stage bootstrap, seeds then prompt ids (`evaluation.ifeval_seeds`; a run
paired against another baseline file is refused, naming it). The arm and seed come from
each report.json's "run" (eval_ifeval --arm / --run_seed, or its model path
`.../seed<S>/<arm>/export/policy`); a run without them is named by its directory. Every
figure pooled over seeds is named so in its table, with the smallest detectable difference
beside a null (METHOD 15).
"""
import json
import os

from absl import app, flags
from experiments import cli  # noqa: E402

_OUT = flags.DEFINE_string("out", "results", "output directory")


def _read(path: str):
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


KINDS = ("grpo_learns", "ablation", "coevolution", "checks_policy", "sensitivity",
         "eval_policy", "evaluator", "ifeval", "checks_sft")
# The entry points whose workdirs hold those kinds (experiments/<script>.py).
SCRIPTS = ("grpo_learns", "ablation", "coevolution", "checks_policy", "sensitivity",
           "sft_generator", "eval_policy", "eval_evaluator", "eval_ifeval")


def kind_of(run_dir: str) -> str:
    """The experiment that wrote `run_dir`: the `kind` field of its summary.json (the
    experiments that train) or report.json (the evaluations), one of `KINDS`. Each writer
    records it; a file written before the field existed (2026-12-06) is named by the keys
    only that experiment writes, so older run directories still render.

    Raises:
        ValueError: the directory holds neither file, or a kind not in KINDS.
    """
    if not os.path.isdir(run_dir):
        raise ValueError(f"{run_dir}: no such directory")
    summary = _read(os.path.join(run_dir, "summary.json")) or {}
    report = _read(os.path.join(run_dir, "report.json")) or {}
    kind = summary.get("kind") or report.get("kind") or _legacy_kind(summary, report)
    if kind is None:
        raise ValueError(f"{run_dir}: no summary.json or report.json of a known experiment")
    if kind not in KINDS:
        raise ValueError(f"{run_dir}: its experiment kind {kind!r} is not one of {KINDS}")
    return kind


def _legacy_kind(summary: dict, report: dict):
    """The kind of a file without the `kind` field (written before it existed), or None."""
    if "parts" in summary:
        return "grpo_learns"
    if "generators" in summary:
        return "ablation"
    if "r_disc" in summary:
        return "coevolution"
    if "arms_run" in summary:
        return "checks_policy"
    if "settings" in summary:
        return "sensitivity"
    if "winrate" in report or "humaneval" in report:
        return "eval_policy"
    if "macro" in report:
        return "evaluator"
    if "metrics" in report and "not_scored" in report:
        return "ifeval"
    return None


def render(run_dir: str, out_stem: str) -> tuple[str, str]:
    """Writes out_stem.md (and .png) for one run directory; returns (kind, command)."""
    from drubric_jax.evaluation import ablation, learning, results

    kind = kind_of(run_dir)
    if kind == "grpo_learns":
        s = _read(os.path.join(run_dir, "summary.json"))
        first = next(iter(s["parts"].values()))
        fresh = learning.summarize_parts(
            {p: os.path.join(run_dir, p) for p in s["parts"]}, first["first_steps"],
            first["last_steps"], s.get("n_bootstrap", 1000), s.get("seed", 0))
        text = learning.markdown_table(fresh, "GRPO learns: reward curves", s["command"],
                                       s.get("wall_s", {}))
        learning.plot_curves(fresh, out_stem + ".png")
        command = s["command"]
    elif kind == "ablation":
        s = _read(os.path.join(run_dir, "summary.json"))
        names = list(s["generators"])
        baseline = s.get("baseline", names[0])
        comparisons = [tuple(k.split(" - ")) for k in s["comparisons"]]
        fresh = ablation.summarize(ablation.load_heldout(run_dir, names), baseline,
                                   comparisons, s["n_bootstrap"], s.get("seed", 0))
        fresh["seed"] = s.get("seed", 0)
        fresh["heldout_paths"] = s.get("heldout_paths", [])
        text = ablation.markdown_table(fresh, s["command"], s.get("wall_s", {}),
                                       ablation.heldout_note(fresh))
        ablation.plot(fresh, out_stem + ".png")
        command = s["command"]
    elif kind == "coevolution":
        from drubric_jax.evaluation import coevolution as co

        s = _read(os.path.join(run_dir, "summary.json"))
        if s.get("mode") == "rounds":  # evaluated from the stages' logs, over R rounds
            from drubric_jax.evaluation import coevolution_rounds as co
            fresh = co.summarize(co.round_values(run_dir), s["n_bootstrap"], s["seed"])
        else:
            fresh = co.summarize(run_dir, s["n_bootstrap"], s["seed"])
        text = co.markdown(fresh, s["command"], s.get("wall_s", {}), s["eval_note"])
        co.plot(fresh, out_stem + ".png")
        command = s["command"]
    elif kind == "checks_policy":
        from drubric_jax.evaluation import checks_policy as cp
        from drubric_jax.evaluation import checks_policy_report as cpr

        s = _read(os.path.join(run_dir, "summary.json"))
        fresh = cp.summarize(run_dir, s["arms_run"], s["seeds"], s["n_bootstrap"], s["seed"],
                             s["window"])
        text = cpr.markdown(fresh, s["command"], s.get("wall_s", {}), s["setup"])
        cpr.plot(fresh, out_stem + ".png")
        command = s["command"]
    elif kind == "sensitivity":
        from drubric_jax.evaluation import sensitivity

        s = _read(os.path.join(run_dir, "summary.json"))
        fresh = sensitivity.summarize(run_dir, s["settings"], s["baseline"],
                                      s.get("n_bootstrap", 1000), s["seed"])
        text = sensitivity.markdown(fresh, s["command"], s.get("wall_s", {}),
                                    s.get("overrides", {}), s["seed"])
        command = s["command"]
    elif kind == "checks_sft":
        from drubric_jax.evaluation import checks_sft
        from drubric_jax.rounds.sft_stage import RECOVERY_FILE

        s = _read(os.path.join(run_dir, "summary.json"))
        with open(os.path.join(run_dir, RECOVERY_FILE), encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        fresh = checks_sft.summaries(rows, s["n_bootstrap"], s["seed"])
        text = checks_sft.markdown(fresh, s["command"], s["setup"], s.get("wall_s", {}))
        command = s["command"]
    elif kind == "eval_policy":
        from drubric_jax.evaluation import policy_eval

        r = _read(os.path.join(run_dir, "report.json"))
        text, command = policy_eval.results_markdown(r), r["command"]
    elif kind == "ifeval":
        from drubric_jax.evaluation import ifeval

        r = _read(os.path.join(run_dir, "report.json"))
        text, command = ifeval.results_markdown(r), r.get("command", "")
    else:
        r = _read(os.path.join(run_dir, "report.json"))
        text = results.results_markdown({run_dir: r})
        results.plot({run_dir: r}, out_stem + ".png")
        command = r.get("command", "")
    with open(out_stem + ".md", "w", encoding="utf-8") as f:
        f.write(text)
    return kind, command


def _ablation_across_seeds(run_dirs) -> str:
    """ablation-seeds.md of several ablation runs (seeds): each run's summary recomputed
    from its files, and the runs' held-out lists pooled by the two-stage bootstrap, runs
    then list ids (`ablation_seeds.pooled_summary`, METHOD 15)."""
    from drubric_jax.evaluation import ablation, ablation_seeds

    summaries, per_run, first = {}, {}, None
    for run_dir in run_dirs:
        s = _read(os.path.join(run_dir, "summary.json"))
        name = os.path.basename(os.path.normpath(run_dir))
        if name in summaries:
            raise SystemExit(f"error: two ablation runs are named {name!r}; their tables "
                             "would share a column")
        first = first or s
        names = list(s["generators"])
        per_run[name] = ablation.load_heldout(run_dir, names)
        comparisons = [tuple(k.split(" - ")) for k in s["comparisons"]]
        summaries[name] = {**ablation.summarize(per_run[name], s.get("baseline", names[0]),
                                                comparisons, s["n_bootstrap"], s.get("seed", 0)),
                           "seed": s.get("seed", 0)}
    common = [g for g in first["generators"] if all(g in r for r in per_run.values())]
    baseline = first.get("baseline", next(iter(first["generators"])))
    comparisons = [tuple(k.split(" - ")) for k in first["comparisons"]
                   if all(g in common for g in k.split(" - "))]
    pooled = ablation_seeds.pooled_summary(per_run, baseline, comparisons,
                                           first["n_bootstrap"], first.get("seed", 0))
    return ablation_seeds.across_seeds(summaries, pooled)


def _coevolution_across_seeds(run_dirs) -> str:
    """coevolution-seeds.md of several coevolution runs (seeds): each run's headline
    differences recomputed from its files, and pooled over the runs by the two-stage
    bootstrap (`coevolution.pooled_headlines` from the runs' eval.json, or
    `coevolution_rounds.pooled_headlines` from their stages' metrics; METHOD 15), seeded
    by the first run's summary.

    Raises:
        SystemExit: the runs mix the samples and rounds evaluations.
    """
    from drubric_jax.evaluation import coevolution as co
    from drubric_jax.evaluation import coevolution_rounds as cr

    summaries, modes, values, ids, first = {}, set(), {}, {}, None
    for run_dir in run_dirs:
        s = _read(os.path.join(run_dir, "summary.json"))
        first = first or s
        name = os.path.basename(os.path.normpath(run_dir))
        modes.add(s.get("mode", "samples"))
        if s.get("mode") == "rounds":
            values[name] = cr.round_values(run_dir)
            ids[name] = cr.heldout_ids(run_dir, values[name]["heldout_rows"])
            fresh = cr.summarize(values[name], s["n_bootstrap"], s["seed"])
        else:
            values[name] = _read(os.path.join(run_dir, "eval.json"))
            fresh = co.summarize(run_dir, s["n_bootstrap"], s["seed"])
        summaries[name] = {**fresh, "seed": s["seed"]}
    if len(modes) > 1:
        raise SystemExit("error: the coevolution runs mix the samples and rounds "
                         f"evaluations ({', '.join(run_dirs)}); report them apart")
    if modes == {"rounds"}:
        return cr.across_seeds(summaries, cr.pooled_headlines(
            values, first["n_bootstrap"], first["seed"], ids))
    return co.across_seeds(summaries, co.pooled_headlines(
        values, first["n_bootstrap"], first["seed"]))


def _ifeval_across_seeds(run_dirs) -> dict:
    """{file name: (markdown, its run directories)} of the IFEval runs paired against a
    baseline: one `ifeval_seeds` table per arm with two or more runs (runs whose arm is not
    recorded make one table together).

    Raises:
        ValueError: a run without per-prompt counts, or runs of one arm that cannot be
            pooled (`ifeval_seeds.check_same_design`: e.g. another baseline file), naming
            the run directory and the field.
    """
    from drubric_jax.evaluation import ifeval_seeds

    return {ifeval_seeds.seeds_file_name(arm): (ifeval_seeds.markdown(ifeval_seeds.summarize(
                [ifeval_seeds.load_run(d) for d in dirs])), dirs)
            for arm, dirs in ifeval_seeds.paired_runs_by_arm(run_dirs).items() if len(dirs) > 1}


def main(argv):
    runs = argv[1:]
    if not runs:
        raise app.UsageError("give one or more RUN_DIRs")
    out = _OUT.value
    try:  # every directory's kind first: a wrong directory is one line, and nothing written
        for run_dir in runs:
            kind_of(run_dir)
    except (ValueError, json.JSONDecodeError) as e:
        # Not a usage error: the arguments parsed; one line, no usage text above it.
        raise SystemExit(f"error: {e}. RUN_DIR is the workdir of one of the experiment "
                         f"scripts {', '.join(SCRIPTS)}; not of experiments.run") from None
    try:  # the across-seeds IFEval tables too: a run that cannot be pooled writes nothing
        ifeval_seeds = _ifeval_across_seeds([d for d in runs if kind_of(d) == "ifeval"])
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    os.makedirs(out, exist_ok=True)
    index = ["# Results", "", "Regenerated by `python -m experiments.report "
             + " ".join(runs) + f" --out={out}`; each file is recomputed from its run "
             "directory.", "", "| file | experiment | run directory | command |",
             "|---|---|---|---|"]
    coevolution, ablations = [], []
    for run_dir in runs:
        name = os.path.basename(os.path.normpath(run_dir))
        kind = kind_of(run_dir)
        stem = os.path.join(out, f"{kind}-{name}")
        kind, command = render(run_dir, stem)
        # Runs from before commands were recorded (an early IFEval report) say so.
        shown = f"`{command}`" if command else "(not recorded)"
        index.append(f"| [{os.path.basename(stem)}.md]({os.path.basename(stem)}.md) | {kind} "
                     f"| `{run_dir}` | {shown} |")
        print(f"wrote {stem}.md ({kind})")
        if kind == "coevolution":
            coevolution.append(run_dir)
        elif kind == "ablation":
            ablations.append(run_dir)
    if len(ablations) > 1:
        path = os.path.join(out, "ablation-seeds.md")
        with open(path, "w", encoding="utf-8") as f:
            f.write(_ablation_across_seeds(ablations))
        index.append(f"| [ablation-seeds.md](ablation-seeds.md) | ablation across runs | "
                     f"{', '.join(f'`{r}`' for r in ablations)} | (the runs' commands) |")
        print(f"wrote {path} (ablation across {len(ablations)} runs)")
    if len(coevolution) > 1:
        text = _coevolution_across_seeds(coevolution)
        path = os.path.join(out, "coevolution-seeds.md")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        index.append(f"| [coevolution-seeds.md](coevolution-seeds.md) | coevolution across "
                     f"runs | {', '.join(f'`{r}`' for r in coevolution)} | (the runs' commands) |")
        print(f"wrote {path} (coevolution across {len(coevolution)} runs)")
    for name, (text, dirs) in ifeval_seeds.items():
        path = os.path.join(out, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        index.append(f"| [{name}]({name}) | IFEval across seeds of one arm | "
                     f"{', '.join(f'`{d}`' for d in dirs)} | (the runs' commands) |")
        print(f"wrote {path} (IFEval across seeds)")
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(index) + "\n")


if __name__ == "__main__":
    cli.run(main)
