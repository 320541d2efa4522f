r"""Co-evolved vs stale evaluator (Figure 2; issues 13 and 41).

    python -m experiments.coevolution --config=configs/coevolution.py --workdir=runs/coevo

configs/coevolution.py says what each stage runs and what is evaluated. Writes, under the
workdir: `round0/`, `coevolved/`, `stale/` (loop runs: metrics.jsonl, checkpoints),
`summary.json` (means with bootstrap 95% CIs and the paired differences), `results.md`,
`coevolution.png`, `wall_s.json` (each stage's wall time, written when it ends), and
prints the table. Running the command again resumes an unfinished stage from its last
checkpoint and skips what is done. Two evaluations (`experiment.evaluation`):
    samples  after training, R = 2: `eval.json` (per-prompt values, written once: a rerun
             reads it back) of R_disc, win rates (or gold scores and the proxy gap in the
             checks world) on `experiment.eval_prompts` prompts;
             `evaluation.coevolution`
    rounds   the checks world over R >= 2 rounds, from what the stages log while they
             train: each round's held-out gold curve point and training proxy-minus-gold
             gap; `evaluation.coevolution_rounds`
"""
import gc
import os
import shlex
import shutil
import sys
import time

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from absl import flags, logging  # noqa: E402
from experiments import cli  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from drubric_jax.rounds import run_logging  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/coevolution.py[:switches]",
                                          lock_config=False)
_WORKDIR = flags.DEFINE_string("workdir", None, "Parent directory of the stages' runs.")
flags.mark_flags_as_required(["config", "workdir"])

SAMPLE_KEY, LIST_KEY, ANSWER_KEY = 31, 37, 41  # fold_in constants of the evaluation keys


def branch(src: str, dst: str) -> None:
    """Copies a finished stage's run directory to start another from its last checkpoint:
    everything but the older checkpoints and parked/, written to dst + ".tmp" and renamed
    (a kill leaves no half copy)."""
    from drubric_jax.rounds import checkpoint as ckpt_lib

    with ckpt_lib.Checkpointer(os.path.join(src, "checkpoints")) as ck:
        latest = ck.latest()
    if latest is None:
        raise FileNotFoundError(f"{src}: no checkpoint to branch from")
    tmp = dst + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)

    def ignore(directory, names):
        if os.path.normpath(directory) == os.path.normpath(os.path.join(src, "checkpoints")):
            return [n for n in names if n.isdigit() and int(n) != latest]
        return ["parked"] if os.path.normpath(directory) == os.path.normpath(src) else []

    shutil.copytree(src, tmp, ignore=ignore)
    os.replace(tmp, dst)


def checks_world(c) -> bool:
    """Whether the run is in the checks world (METHOD 13): gold scores replace win rates."""
    return c.verifier.kind == "checks"


def eval_rows(c) -> list:
    """The evaluation prompts: a seeded subset of eval_file's rows after the first
    data.max_prompt_rows (the policy's training pool when it is the same file); in the
    checks world a subset of the held-out prompts drawn with `experiment.eval_seed`
    (`PromptItem`s with their true checks), which no step trains on: the same prompts for
    every run seed, so that seeds are compared on one set."""
    import numpy as np

    from drubric_jax.evaluation import policy_eval

    e = c.experiment
    if checks_world(c):
        from drubric_jax.data.sources import prompts_from_jsonl

        items = prompts_from_jsonl(e.eval_file)
        bad = [it.id for it in items if not (it.meta or {}).get("checks")]
        if bad or len(items) < e.eval_prompts:
            raise ValueError(f"config.experiment.eval_file: {e.eval_file} needs >= "
                             f"{e.eval_prompts} prompts with meta.checks; has {len(items)}"
                             + (f", {len(bad)} without checks (first {bad[0]!r})" if bad
                                else ""))
        keep = np.random.default_rng(e.eval_seed).choice(len(items), e.eval_prompts,
                                                         replace=False)
        return [items[i] for i in sorted(keep.tolist())]
    if not e.eval_file:
        raise ValueError("config.experiment.eval_file: give a JSONL of prompts with "
                         "'reference' answers")
    rows = policy_eval.load_prompt_rows(e.eval_file, 0, c.seed)[c.data.max_prompt_rows:]
    if len(rows) < e.eval_prompts:
        raise ValueError(f"config.experiment.eval_file: {e.eval_file} has {len(rows)} rows "
                         f"after the first data.max_prompt_rows = {c.data.max_prompt_rows}, "
                         f"fewer than experiment.eval_prompts = {e.eval_prompts}")
    keep = np.random.default_rng(c.seed).choice(len(rows), e.eval_prompts, replace=False)
    return [rows[i] for i in sorted(keep.tolist())]


def _stage_params(run, workdir: str, stage: str) -> dict:
    """Each trainee's forward params at the last checkpoint of `stage` (a run directory
    beside this one), the AdamW moments not read: {role name: params}."""
    from drubric_jax.rounds.run_state import trained_params_at

    trained = trained_params_at(run, os.path.join(workdir, stage, "checkpoints"))
    return {t.role.value: t.forward_params(trained[t.role.value])
            for t in run.ctx.roles.trainees()}


def evaluate(c, workdir: str) -> dict:
    """Per-prompt R_disc and win-rate values of every (generator, policy) state."""
    import jax
    import numpy as np

    from drubric_jax.rounds import loop
    from drubric_jax.evaluation import checks_policy as cp
    from drubric_jax.evaluation import coevolution as co
    from drubric_jax.evaluation import policy_eval
    from drubric_jax.types import Role

    e = c.experiment
    rows = eval_rows(c)
    prompts, hists = [r.prompt for r in rows], [list(r.history) for r in rows]
    run = loop.setup(c, os.path.join(workdir, "coevolved"))
    try:
        loop.restore(run)
        roles = run.ctx.roles

        stale, first = (_stage_params(run, workdir, stage) for stage in ("stale", "round0"))
        policies = {"P0": roles.params("policy_ref"), "P1": first["policy"],
                    "P2": roles.params(Role.POLICY), "~P2": stale["policy"]}
        generators = {"G1": stale["generator"], "G2": roles.params(Role.GENERATOR)}
        base = jax.random.PRNGKey(c.seed)
        checks = checks_world(c)
        out = {"ids": [r.id for r in rows], "r_disc": {}}
        out.update({"gold": {}, "gold_samples": {}, "proxy": {}, "gap": {}} if checks
                   else {"win_rate": {}, "preference": {}})
        t0 = time.perf_counter()

        def lap(what):
            # Where the evaluation's time goes (it is most of the experiment's).
            nonlocal t0
            t, t0 = t0, time.perf_counter()
            logging.info("evaluation: %s in %.1f s", what, t0 - t)

        for p in ("P1", "P2", "~P2"):
            # One set of samples per policy, shared by both generators (paired).
            sets = co.policy_samples(run.ctx, policies[p], jax.random.fold_in(base, SAMPLE_KEY),
                                     prompts, hists)
            lap(f"samples of {p}")
            for g, gp in generators.items():
                r = co.rdisc_per_prompt(run.ctx, gp, jax.random.fold_in(base, LIST_KEY),
                                        prompts, hists, sets, e.num_lists, e.list_temperature)
                out["r_disc"][f"{g} | {p}"] = r["r_disc"].tolist()
                if checks:
                    out["proxy"][f"{g} | {p}"] = r["proxy"].tolist()
                lap(f"R_disc of {g} on {p}")
            if checks:  # the samples' gold, mean over the K of each prompt
                gold = np.asarray([cp.gold_of([it] * len(ys), ys) for it, ys in zip(rows, sets)])
                out["gold_samples"][p] = np.nanmean(gold, axis=1).tolist()
        if checks:
            # Each arm's policy against the generator it trained with: P2 with G2, ~P2 with
            # the stale G1.
            for g, p in (("G2", "P2"), ("G1", "~P2")):
                out["gap"][f"{g} | {p}"] = (np.asarray(out["proxy"][f"{g} | {p}"])
                                            - np.asarray(out["gold_samples"][p])).tolist()
        tok, cfg = roles.policy.model.tokenizer, roles.policy.model.cfg
        refs = [] if checks else [policy_eval.reference_of(r) for r in rows]
        for p, pp in policies.items():
            answers, _ = policy_eval.answers(
                cfg, pp, tok, prompts, key=jax.random.fold_in(base, ANSWER_KEY),
                max_prompt_tokens=c.policy.max_prompt_tokens, max_new_tokens=e.answer_tokens,
                temperature=0.0, histories=hists, mesh=run.ctx.mesh)
            if checks:  # exact: the answers' gold scores, no judge
                out["gold"][p] = cp.gold_of(rows, answers)
                lap(f"answers and gold of {p}")
                continue
            a, b = policy_eval.judge_pairs(run.ctx.verifier, roles.params("verifier"), prompts,
                                           answers, refs, e.judge_max_tokens, hists)
            win, preference = policy_eval.win_units(a, b)
            out["win_rate"][p], out["preference"][p] = win.tolist(), preference.tolist()
            lap(f"answers and judging of {p}")
        return out
    finally:
        loop.close(run)
        del run
        gc.collect()


def check_evaluation(c) -> str:
    """The evaluation `experiment.evaluation` names, checked against the run config:
    "samples" (after training, on `experiment.eval_prompts` prompts: R_disc, win rates or
    gold, the proxy gap; round 0 and one more round) or "rounds" (the checks world's
    held-out gold curve and training gaps, logged while the arms train; any R >= 2).

    Raises:
        ValueError: an unknown evaluation, or a config it cannot run with (names the field).
    """
    kind = c.experiment.get("evaluation", "samples")
    if kind not in ("samples", "rounds"):
        raise ValueError(f"config.experiment.evaluation: {kind!r} not in ('samples', 'rounds')")
    if kind == "samples" and c.rounds.num_rounds != 2:
        raise ValueError("config.rounds.num_rounds must be 2 with experiment.evaluation = "
                         "'samples' (round 0, then the two arms' round 1), got "
                         f"{c.rounds.num_rounds}")
    if kind == "rounds":
        if not checks_world(c):
            raise ValueError("config.experiment.evaluation = 'rounds' needs the checks world "
                             "(world=checks): it reads gold scores")
        if c.rounds.num_rounds < 2:
            raise ValueError(f"config.rounds.num_rounds: {c.rounds.num_rounds} < 2 (round 0, "
                             "then the arms' rounds)")
        if not c.rounds.heldout_gold_every or not c.rounds.policy_steps:
            raise ValueError("config.rounds.heldout_gold_every and rounds.policy_steps must be "
                             "> 0 with experiment.evaluation = 'rounds' (the gold curve is "
                             "its evaluation)")
    return kind


def _summarize_rounds(c, workdir: str, wall: dict) -> None:
    from drubric_jax.evaluation import coevolution_rounds as cr

    e = c.experiment
    summary = cr.summarize(cr.round_values(workdir), e.n_bootstrap, c.seed)
    command = shlex.join(["python", "-m", "experiments.coevolution"] + sys.argv[1:])
    note = (f"the first {summary['heldout_rows']} rows of "
            + "/".join(os.path.normpath(c.rounds.heldout_gold_path).split(os.sep)[-2:])
            + " (never trained on), greedy and one sample at the policy's temperature")
    run_logging.write_json(os.path.join(workdir, "summary.json"), {
        "kind": "coevolution", "mode": "rounds", "command": command, "wall_s": wall,
        "seed": int(c.seed), "n_bootstrap": int(e.n_bootstrap), "eval_note": note,
        **summary}, indent=2)
    table = cr.markdown(summary, command, wall, note)
    with open(os.path.join(workdir, "results.md"), "w") as f:
        f.write(table)
    cr.plot(summary, os.path.join(workdir, "coevolution.png"))
    print(table, flush=True)


def main(argv):
    del argv
    from drubric_jax.rounds import loop
    from drubric_jax.evaluation import coevolution as co

    c, workdir = _CONFIG.value, _WORKDIR.value
    e = c.experiment
    mode = check_evaluation(c)
    if mode == "samples":
        eval_rows(c)  # a bad evaluation file fails before any training
    summary_path = os.path.join(workdir, "summary.json")
    first = c.copy_and_resolve_references()
    first.rounds.num_rounds = 1
    stages = [("round0", first, None)]
    for arm in ("coevolved", "stale"):
        cfg = c.copy_and_resolve_references()
        if arm == "stale":
            cfg.rounds.generator_rounds = 1  # G_1 kept from round 1 on
        stages.append((arm, cfg, "round0"))
    for name, cfg, parent in stages:
        d = os.path.join(workdir, name)
        if loop.finished(d, cfg) is not None:
            continue
        t0 = time.perf_counter()
        if parent is not None and not os.path.exists(d):
            branch(os.path.join(workdir, parent), d)
        loop.run(cfg, d)
        gc.collect()
        run_logging.add_wall_time(workdir, name, time.perf_counter() - t0)
    if mode == "rounds":
        _summarize_rounds(c, workdir, run_logging.wall_times(workdir))
        return
    eval_path = os.path.join(workdir, "eval.json")
    if not os.path.exists(eval_path):
        t0 = time.perf_counter()
        values = evaluate(c, workdir)
        run_logging.write_json(eval_path, values)
        run_logging.add_wall_time(workdir, "evaluation", time.perf_counter() - t0)
    wall = run_logging.wall_times(workdir)
    summary = co.summarize(workdir, e.n_bootstrap, c.seed)
    command = shlex.join(["python", "-m", "experiments.coevolution"] + sys.argv[1:])
    note = co.eval_note(e.eval_file, 0 if checks_world(c) else c.data.max_prompt_rows,
                        e.eval_seed if checks_world(c) else c.seed, len(summary["ids"]))
    run_logging.write_json(summary_path, {
        "kind": "coevolution", "command": command, "wall_s": wall, "seed": int(c.seed),
        "n_bootstrap": int(e.n_bootstrap), "eval_note": note, **summary}, indent=2)
    table = co.markdown(summary, command, wall, note)
    with open(os.path.join(workdir, "results.md"), "w") as f:
        f.write(table)
    co.plot(summary, os.path.join(workdir, "coevolution.png"))
    print(table, flush=True)


if __name__ == "__main__":
    cli.run(main)
