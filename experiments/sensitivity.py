r"""Sensitivity to lambda (Eq. 24-25) and K in the checks world (issue 32, question 4).

    python -m experiments.sensitivity --config=configs/sensitivity.py --workdir=runs/sensitivity

configs/sensitivity.py says what each setting changes and what is measured. Writes, in the
workdir: `<setting>/` (the loop run, its `heldout_generator.json`: the trained generator's
values on the held-out anchor lists, and `heldout.json`: the trained policy's held-out
answers and gold scores), `p0_heldout.json`, `summary.json`, `results.md`. Running the
command again resumes: a finished run or evaluation is skipped.
"""
import gc
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

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/sensitivity.py[:switches]",
                                          lock_config=False)
_WORKDIR = flags.DEFINE_string("workdir", None, "Parent directory of the settings' runs.")
flags.mark_flags_as_required(["config", "workdir"])

EVAL_KEY = 7_919  # fold_in of the seed's key for the held-out rubric sampling (as ablation's)




def score_generator(cfg, run_dir: str, path: str) -> None:
    """The trained generator of `run_dir` on the held-out anchor lists
    (`evaluation.ablation.heldout_per_list`, constraint recovery included), to `path`."""
    import jax
    import numpy as np

    from drubric_jax.evaluation import ablation
    from drubric_jax.rounds import hostmem, loop

    e = cfg.experiment
    run = loop.setup(cfg, run_dir)
    try:
        loop.restore(run)
        key = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), EVAL_KEY)
        out = ablation.heldout_per_list(run.ctx, key, run.data.heldout_anchors, e.eval_lists,
                                        e.eval_temperature)
        run_logging.write_json(path, {k: (v.tolist() if isinstance(v, np.ndarray) else v)
                           for k, v in out.items()})
    finally:
        loop.close(run)
        del run
        gc.collect()
        hostmem.release_free_memory()


def main(argv):
    del argv
    from configs.sensitivity import BASELINE, SETTINGS, setting_config
    from configs.checks_world import CHECKS_FILES
    from drubric_jax.evaluation import checks_policy as cp
    from drubric_jax.evaluation import sensitivity
    from drubric_jax.rounds import loop, run_logging

    c, workdir = _CONFIG.value, _WORKDIR.value
    e = c.experiment
    os.makedirs(workdir, exist_ok=True)
    names = [s.strip() for s in e.settings.split(",") if s.strip()]
    cfgs = {n: setting_config(c, n) for n in names}  # every setting checked before compute
    try:  # a file of another split (world v2) stops here, naming the row and both splits
        items, budgets = cp.heldout_setup(
            c, os.path.join(c.data.checks_dir, CHECKS_FILES["heldout"]), e.heldout_rows,
            e.eval_batch)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None

    def timed(stage, path, fn):
        if os.path.exists(path):
            return
        t0 = time.perf_counter()
        fn()
        run_logging.add_wall_time(workdir, stage, time.perf_counter() - t0)

    p0 = os.path.join(workdir, cp.P0_FILE)
    timed("heldout P_0", p0, lambda: run_logging.write_json(
        p0, cp.heldout_gold(c.model.policy, items, **budgets)))
    for n in names:
        d, cfg = os.path.join(workdir, n), cfgs[n]
        timed(n, os.path.join(d, loop.FINISHED), lambda: loop.run(cfg, d))
        gen = os.path.join(d, sensitivity.GENERATOR_FILE)
        timed(f"generator of {n}", gen, lambda: score_generator(cfg, d, gen))
        pol = os.path.join(d, cp.HELDOUT_FILE)
        timed(f"policy of {n}", pol, lambda: run_logging.write_json(pol, cp.heldout_gold(
            os.path.join(d, "export", "policy"), items, **budgets)))
    base = BASELINE if BASELINE in names else names[0]
    summary = sensitivity.summarize(workdir, names, base, int(e.n_bootstrap), int(c.seed))
    command = shlex.join(["python", "-m", "experiments.sensitivity"] + sys.argv[1:])
    summary.update(kind="sensitivity", command=command,
                   wall_s=run_logging.wall_times(workdir), seed=int(c.seed),
                   n_bootstrap=int(e.n_bootstrap),
                   overrides={n: SETTINGS[n] for n in names})
    run_logging.write_json(os.path.join(workdir, "summary.json"), summary)
    text = sensitivity.markdown(summary, command, summary["wall_s"], summary["overrides"],
                                summary["seed"])
    with open(os.path.join(workdir, "results.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text, flush=True)


if __name__ == "__main__":
    cli.run(main)
