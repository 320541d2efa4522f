r"""Does a rubric reward raise the gold score? Policy-only GRPO in the checks world, one run
per arm and seed, then every policy answers the held-out prompts (issue 32, question 1).

    python -m experiments.checks_policy --config=configs/checks_policy.py --workdir=runs/checks_policy

configs/checks_policy.py says what each arm trains on. Writes, in the workdir:
    p0_heldout.json            P_0's greedy answers to the held-out prompts, gold scored
    seed<S>/<arm>/             the arm's co-evolution loop run (settings.json: its resolved
                               settings, flattened; metrics.jsonl, checkpoints,
                               export/policy), and heldout.json: the trained policy's answers
    summary.json, results.md, curves.png   (`drubric_jax.evaluation.checks_policy`)
Running the command again resumes: a finished run or evaluation is skipped, an unfinished
run continues from its last checkpoint (`wall_s.json` keeps each finished stage's time).
"""
import os
import shlex
import sys
import time

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from absl import flags  # noqa: E402
from experiments import cli  # noqa: E402
from ml_collections import config_flags  # noqa: E402


_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/checks_policy.py[:switches]",
                                          lock_config=False)
_WORKDIR = flags.DEFINE_string("workdir", None, "Parent directory of the runs.")
_SUMMARIZE_ONLY = flags.DEFINE_bool(
    "summarize_only", False, "Train and evaluate nothing: summarize the (arm, seed) runs "
    "already evaluated in the workdir (an arm over the seeds it has).")
flags.mark_flags_as_required(["config", "workdir"])




def main(argv):
    del argv
    from drubric_jax.evaluation import checks_policy as cp
    from drubric_jax.evaluation import checks_policy_report as cpr
    from drubric_jax.rounds import loop, run_logging
    from configs.checks_policy import arm_config
    from configs.checks_world import CHECKS_FILES

    c, workdir = _CONFIG.value, _WORKDIR.value
    e = c.experiment
    os.makedirs(workdir, exist_ok=True)
    arms = [a.strip() for a in e.arms.split(",") if a.strip()]
    seeds = [int(s) for s in str(e.seeds).split(",") if s.strip()]
    # Every (arm, seed) checked before any compute (a summary needs no trained generator).
    cfgs = {} if _SUMMARIZE_ONLY.value else {
        (arm, s): arm_config(c, arm, s) for s in seeds for arm in arms}
    heldout_path = os.path.join(c.data.checks_dir, CHECKS_FILES["heldout"])
    if not os.path.exists(heldout_path):  # before any model loads: say what to build
        build = c.data.checks_build
        raise SystemExit(f"error: no such file {heldout_path}" + (
            "\nBuild the checks world's files first (from the repository root):\n  "
            + build.replace("\n", "\n  ") if build else ""))
    try:  # a file of another split (world v2) stops here, naming the row and both splits
        items, budgets = cp.heldout_setup(c, heldout_path, e.heldout_rows, e.eval_batch)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None

    def evaluate(model: str, path: str, stage: str):
        if os.path.exists(path):
            return
        t0 = time.perf_counter()
        out = cp.heldout_gold(model, items, **budgets)
        out["heldout_file"] = heldout_path
        run_logging.write_json(path, out)
        run_logging.add_wall_time(workdir, stage, time.perf_counter() - t0)

    evaluate(c.model.policy, os.path.join(workdir, cp.P0_FILE), "heldout P_0")
    for s in ([] if _SUMMARIZE_ONLY.value else seeds):
        for arm in arms:
            cfg = cfgs[arm, s].copy_and_resolve_references()
            cfg.seed = s
            d = cp.run_dir(workdir, s, arm)
            t0 = time.perf_counter()
            was_finished = loop.finished(d, cfg) is not None
            loop.run(cfg, d)
            if not was_finished:
                run_logging.add_wall_time(workdir, f"seed{s}/{arm}", time.perf_counter() - t0)
            evaluate(os.path.join(d, "export", "policy"), os.path.join(d, cp.HELDOUT_FILE),
                     f"heldout seed{s}/{arm}")
    command = shlex.join(["python", "-m", "experiments.checks_policy"] + sys.argv[1:])
    # The file by its last two path parts (e.g. checks_world/heldout.jsonl): the header
    # reads the same on any machine.
    heldout_name = "/".join(os.path.normpath(heldout_path).split(os.sep)[-2:])
    setup = (f"{len(items)} held-out prompts ({heldout_name}); {e.policy_steps} policy steps "
             f"of {c.policy.prompts_per_step} prompts x K = {c.policy.num_responses} "
             f"responses of <= {c.policy.max_new_tokens} tokens, learning rate "
             f"{c.policy.train.learning_rate}; policy {c.model.policy}; trained generator "
             f"{e.trained_generator or '-'}; LoRA rank {c.lora.rank}; beta "
             f"{c.policy.train.beta}; every rubric arm's lists at temperature "
             f"{float(e.list_temperature)} (experiment.list_temperature); held-out answers "
             "greedy"
             + (f" and {budgets['samples']} samples per prompt at temperature "
                f"{budgets['temperature']}" if budgets.get("samples") else ""))
    summary = cp.summarize(workdir, arms, seeds, int(e.n_bootstrap), int(c.seed),
                           int(e.window))
    wall = run_logging.wall_times(workdir)
    run_logging.write_json(os.path.join(workdir, "summary.json"), {
        "kind": "checks_policy", "command": command, "setup": setup, "wall_s": wall,
        "arms_run": arms, "seeds": seeds, "n_bootstrap": int(e.n_bootstrap),
        "seed": int(c.seed), "window": int(e.window), **summary})
    text = cpr.markdown(summary, command, wall, setup)
    with open(os.path.join(workdir, "results.md"), "w", encoding="utf-8") as f:
        f.write(text)
    cpr.plot(summary, os.path.join(workdir, "curves.png"))
    print(text, flush=True)


if __name__ == "__main__":
    cli.run(main)
