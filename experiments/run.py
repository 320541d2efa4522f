r"""Runs DynamicRubric co-evolution (Algorithm 1): generator and policy rounds.

    python -m experiments.run --config=configs/smollm2_cpu.py --workdir=runs/default
    python -m experiments.run --config=configs/smollm2_cpu.py:data=shared --workdir=runs/shared \
        --config.rounds.num_rounds=1

Running the same command on the same workdir resumes from its last checkpoint.
Multi-host: pass --distributed to call jax.distributed.initialize() (one process per host).
"""
import os

# transformers prints a "PyTorch was not found" notice at import; tokenizers are all we use.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output and checkpoint directory.")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize().")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Also show other libraries' INFO logs (Orbax).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    import jax

    from drubric_jax import loop, run_logging

    run_logging.quiet_third_party_logs(not _VERBOSE.value)
    if _DISTRIBUTED.value:
        jax.distributed.initialize()
    logging.info("JAX devices (process %d of %d): %s", jax.process_index(),
                 jax.process_count(), jax.devices())
    # Validates the config, then checks the data, before any weights load.
    loop.run(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
