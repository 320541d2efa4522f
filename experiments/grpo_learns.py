r"""Does GRPO learn at all? A rule-reward policy run, then a DynamicRubric one (issue 13).

    python -m experiments.grpo_learns --config=configs/grpo_learns.py --workdir=runs/grpo_learns

Runs the parts of `config.experiment.parts` one after another (configs/grpo_learns.py says
what each is), each as a co-evolution loop run with no generator steps in
`<workdir>/<part>/` (metrics.jsonl, checkpoints, trace), then writes
`<workdir>/summary.json` (per part: mean reward per step, last-minus-first difference
with its bootstrap 95% CI), `<workdir>/results.md` and `<workdir>/reward_curves.png`, and
prints the table. Running the command again resumes an unfinished part from its last
checkpoint and skips finished ones (`wall_s.json` keeps each part's wall time, written
when the part ends).
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

from drubric_jax.rounds import run_logging  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/grpo_learns.py[:switches]",
                                          lock_config=False)
_WORKDIR = flags.DEFINE_string("workdir", None, "Parent directory of the parts' runs.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    from drubric_jax.rounds import loop
    from drubric_jax.rl import rule_rewards
    from drubric_jax.evaluation import learning

    c, workdir = _CONFIG.value, _WORKDIR.value
    e = c.experiment
    summary_path = os.path.join(workdir, "summary.json")
    dirs = {}
    for part in [p.strip() for p in e.parts.split(",") if p.strip()]:
        if part not in ("rule", "rubric"):
            raise ValueError(f"config.experiment.parts: {part!r} is not 'rule' or 'rubric'")
        cfg = c.copy_and_resolve_references()
        cfg.policy.reward = e.rule if part == "rule" else rule_rewards.RUBRIC
        cfg.rounds.policy_steps = e.policy_steps
        dirs[part] = os.path.join(workdir, part)
        t0 = time.perf_counter()
        was_finished = loop.finished(dirs[part], cfg) is not None
        loop.run(cfg, dirs[part])
        if not was_finished:
            run_logging.add_wall_time(workdir, part, time.perf_counter() - t0)
    wall = run_logging.wall_times(workdir)
    summary = learning.summarize_parts(dirs, e.first_steps, e.last_steps, e.n_bootstrap,
                                       c.seed)
    command = shlex.join(["python", "-m", "experiments.grpo_learns"] + sys.argv[1:])
    run_logging.write_json(summary_path, {
        "kind": "grpo_learns", "command": command, "wall_s": wall,
        "n_bootstrap": int(e.n_bootstrap), "seed": int(c.seed), "parts": summary}, indent=2)
    table = learning.markdown_table(summary, "GRPO learns: reward curves", command, wall)
    with open(os.path.join(workdir, "results.md"), "w") as f:
        f.write(table)
    learning.plot_curves(summary, os.path.join(workdir, "reward_curves.png"))
    print(table, flush=True)


if __name__ == "__main__":
    cli.run(main)
