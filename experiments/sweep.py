r"""Runs a config file's sweep (`get_sweep()`, big_vision style): one run per override set.

    python -m experiments.sweep --config=configs/smollm2_cpu.py:tiny --workdir=runs/ablation
    python -m experiments.sweep --config=configs/qwen3_8b.py --workdir=gs://b/abl --print

Each override dict of `get_sweep()` (e.g. {"config.variant": "disc_only"}) becomes one run of
`experiments.run` in its own workdir `<workdir>/<name>`, the name built from the overrides
("variant=disc_only"). Here the runs go one after another, each in a fresh process (and each
resumes from its own checkpoint when the sweep is started again); with `--print` the
command lines are printed instead, one per line, for a cluster scheduler.
"""
import importlib.util
import os
import re
import shlex
import subprocess
import sys

from absl import flags
from experiments import cli  # noqa: E402

_CONFIG = flags.DEFINE_string("config", None, "Config file with get_sweep(), e.g. "
                              "configs/smollm2_cpu.py:tiny (the ':' argument is passed on).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Parent of the runs' workdirs.")
_PRINT = flags.DEFINE_bool("print", False, "Print the command lines instead of running them.")
flags.mark_flags_as_required(["config", "workdir"])


def load_sweep(config_arg: str) -> list:
    """The override dicts of the config file's `get_sweep()`.

    Raises:
        ValueError: the file has no get_sweep(), or an override key does not start with
            "config.".
    """
    path = config_arg.split(":", 1)[0]
    spec = importlib.util.spec_from_file_location("sweep_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_sweep"):
        raise ValueError(f"{path} defines no get_sweep()")
    sweep = list(module.get_sweep())
    for overrides in sweep:
        bad = [k for k in overrides if not k.startswith("config.")]
        if bad:
            raise ValueError(f"{path}: get_sweep() keys must start with 'config.', got {bad}")
    return sweep


def run_name(overrides: dict) -> str:
    """A workdir name from the overrides: "variant=disc_only,generator.lam=0.5"."""
    parts = [f"{k[len('config.'):]}={v}" for k, v in sorted(overrides.items())]
    return re.sub(r"[^A-Za-z0-9._=,-]", "_", ",".join(parts)) or "base"


def commands(config_arg: str, workdir: str) -> list:
    """[(workdir of the run, argv)] for every override set of the sweep."""
    out = []
    for overrides in load_sweep(config_arg):
        run_dir = os.path.join(workdir, run_name(overrides))
        argv = [sys.executable, "-m", "experiments.run", f"--config={config_arg}",
                f"--workdir={run_dir}"] + [f"--{k}={v}" for k, v in sorted(overrides.items())]
        out.append((run_dir, argv))
    return out


def main(argv):
    del argv
    cmds = commands(_CONFIG.value, _WORKDIR.value)
    if _PRINT.value:
        for _, argv in cmds:
            print(shlex.join(["python"] + argv[1:]))  # this interpreter's path is local
        return
    for i, (run_dir, argv) in enumerate(cmds):
        print(f"[{i + 1}/{len(cmds)}] {run_dir}", flush=True)
        subprocess.run(argv, check=True)


if __name__ == "__main__":
    cli.run(main)
