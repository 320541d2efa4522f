r"""Runs DynamicRubric co-evolution (Algorithm 1): generator and policy rounds.

    python -m experiments.run --config=configs/smollm2_cpu.py --workdir=runs/default
    python -m experiments.run --config=configs/smollm2_cpu.py:data=shared --workdir=runs/shared \
        --config.rounds.num_rounds=1

Running the same command on the same workdir resumes from its last checkpoint.

Multi-host: the same command on every host with --distributed, which calls
jax.distributed.initialize() (one process per host). On a Cloud TPU slice and under SLURM
or Open MPI it finds the coordinator, process count and id itself; elsewhere pass them:
    python -m experiments.run --config=... --workdir=... --distributed \
        --coordinator_address=10.0.0.1:12355 --num_processes=2 --process_id=0
The workdir must be one place every host sees (a shared filesystem, or a gs:// URL for the
checkpoints and files). See docs/SCALE.md, "Multi-host runs".
"""
import os

# transformers prints a "PyTorch was not found" notice at import; tokenizers are all we use.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from absl import flags, logging  # noqa: E402
from experiments import cli  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output and checkpoint directory.")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize().")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0 (default: detected, or the "
    "JAX_COORDINATOR_ADDRESS environment variable)")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "processes (default: detected)")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "this process (default: detected)")
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_timeout_s", 100, "seconds without a heartbeat after which the other "
    "processes of a multi-process run stop with an error (a host died)")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    import jax

    from drubric_jax.rounds import loop

    if _DISTRIBUTED.value:
        jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value,
                                   _PROCESS_ID.value,
                                   heartbeat_timeout_seconds=_HEARTBEAT.value)
    logging.info("JAX devices (process %d of %d): %s", jax.process_index(),
                 jax.process_count(), jax.devices())
    from drubric_jax.data import MissingDataFile

    # Validates the config, then checks the data, before any weights load.
    try:
        loop.run(_CONFIG.value, _WORKDIR.value)
    except MissingDataFile as e:  # the message says what to build: no traceback
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    cli.run(main)
