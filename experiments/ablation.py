r"""Generator objective ablation (Table 3, METHOD 6; issue 13): full vs disc_only vs
anchor_only vs the zero-shot generator, on held-out anchor lists.

    python -m experiments.ablation --config=configs/ablation.py --workdir=runs/ablation

configs/ablation.py says what each variant runs and what is held out. Writes, under the
workdir: `<variant>/` (each variant's loop run: metrics.jsonl, checkpoints),
`<generator>/heldout.json` (per held-out anchor list values of that generator, written
once: a rerun reads them back), `summary.json` (means with bootstrap 95% CIs, the paired
differences to the zero-shot generator and full minus each ablation), `results.md` and
`ablation.png`, and prints the table. Running the command again resumes an unfinished
variant from its last checkpoint and skips what is done (`wall_s.json` keeps the wall
time of each variant, written when it ends: `run_logging.add_wall_time`).
"""
import gc
import json
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

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/ablation.py[:switches]",
                                          lock_config=False)
_WORKDIR = flags.DEFINE_string("workdir", None, "Parent directory of the variants' runs.")
flags.mark_flags_as_required(["config", "workdir"])

EVAL_KEY = 7_919  # fold_in of the seed's key for the held-out rubric sampling (any constant)


def _scored(path: str):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _score(run, c, path: str, name: str) -> dict:
    """The held-out values of the generator `run` holds now, saved to `path`."""
    import jax
    import numpy as np

    from drubric_jax.evaluation import ablation

    e = c.experiment
    key = jax.random.fold_in(jax.random.PRNGKey(c.seed), EVAL_KEY)  # same for every generator
    t0 = time.perf_counter()
    out = ablation.heldout_per_list(run.ctx, key, run.data.heldout_anchors, e.eval_lists,
                                    e.eval_temperature, static=c.variant == "static")
    record = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in out.items()}
    record["generator"], record["seconds"] = name, time.perf_counter() - t0
    os.makedirs(os.path.dirname(path), exist_ok=True)
    run_logging.write_json(path, record)
    return record


def main(argv):
    del argv
    from drubric_jax.rounds import hostmem
    from drubric_jax.rounds import loop
    from drubric_jax.rounds import run_logging
    from drubric_jax.evaluation import ablation

    c, workdir = _CONFIG.value, _WORKDIR.value
    e = c.experiment
    variants = [v.strip() for v in e.variants.split(",") if v.strip()]
    for v in variants:
        if v not in ("full", "disc_only", "anchor_only"):
            raise ValueError(f"config.experiment.variants: {v!r} is not full, disc_only or "
                             "anchor_only")
    if c.data.heldout_anchor_rows < 1:
        raise ValueError("config.data.heldout_anchor_rows must be >= 1: the ablation is "
                         "scored on held-out anchor lists")
    if c.rounds.generator_steps % c.checkpoint.every_steps:
        # A finished variant is read back from its last checkpoint: it must hold the end.
        raise ValueError(f"config.rounds.generator_steps={c.rounds.generator_steps} must be "
                         f"a multiple of config.checkpoint.every_steps="
                         f"{c.checkpoint.every_steps}")
    summary_path = os.path.join(workdir, "summary.json")
    for v in variants:
        cfg = c.copy_and_resolve_references()
        cfg.variant = v
        run_dir = os.path.join(workdir, v)
        # The zero-shot file exists once G_0 is scored (the first variant's setup does it).
        need_zero = not os.path.exists(os.path.join(workdir, e.baseline, "heldout.json"))
        done = _scored(os.path.join(run_dir, "heldout.json"))
        if done is not None and not need_zero:
            continue
        t0 = time.perf_counter()
        run = loop.setup(cfg, run_dir)
        try:
            if need_zero:  # G_0: scored before any step (setup restores nothing)
                _score(run, cfg, os.path.join(workdir, e.baseline, "heldout.json"),
                       e.baseline)
            if done is None:
                if loop.finished(run_dir, cfg) is None:
                    loop.run_rounds(run)
                else:
                    loop.restore(run)
                _score(run, cfg, os.path.join(run_dir, "heldout.json"), v)
        finally:
            loop.close(run)
            del run
            gc.collect()
            hostmem.release_free_memory()
        run_logging.add_wall_time(workdir, v, time.perf_counter() - t0)
    wall = run_logging.wall_times(workdir)
    names = [e.baseline] + variants
    per = ablation.load_heldout(workdir, names)  # what the files hold: a rerun reads the same
    comparisons = [("full", ab) for ab in ("disc_only", "anchor_only")
                   if "full" in variants and ab in variants]
    summary = ablation.summarize(per, e.baseline, comparisons, e.n_bootstrap, c.seed)
    command = shlex.join(["python", "-m", "experiments.ablation"] + sys.argv[1:])
    run_logging.write_json(summary_path, {
        "kind": "ablation", "command": command, "wall_s": wall, "seed": int(c.seed),
        "baseline": e.baseline, "variants": variants, "heldout_ids": per[e.baseline]["ids"],
        "generator_steps": int(c.rounds.generator_steps), "eval_lists": int(e.eval_lists),
        "heldout_paths": list(c.data.heldout_anchor_paths),
        **summary}, indent=2)
    summary["seed"] = int(c.seed)
    summary["heldout_paths"] = list(c.data.heldout_anchor_paths)
    table = ablation.markdown_table(summary, command, wall, ablation.heldout_note(summary))
    with open(os.path.join(workdir, "results.md"), "w") as f:
        f.write(table)
    ablation.plot(summary, os.path.join(workdir, "ablation.png"))
    print(table, flush=True)


if __name__ == "__main__":
    cli.run(main)
