"""`config.<role>.train.remat` as the bool a trainee's TrainConfig holds (issue 54).

True and False stand. "auto" (configs/base.py's default) asks the memory planner:
recompute each layer in the backward pass only where the update with every layer's
activations saved would not fit the device (`memory.remat.resolve_remat`). The planner
sits in a layer above this one (`memory/` reads the run's configs through `rounds/`:
tests/test_architecture.py), so it is handed in, once per process, by
`memory.remat.install()`, which every experiment entry point calls before it runs
(`experiments.cli.run`). Where nothing installed it (a script or a test that calls
`rounds.loop.run` itself), "auto" recomputes, the choice that fits wherever the update
fits at all, and says so in the log.
"""
from __future__ import annotations

from typing import Callable, Optional

from absl import logging

from drubric_jax.rl.train_config import REMAT_AUTO

# (run config, role) -> bool: `memory.remat.resolve_remat` once installed.
_planner: Optional[Callable] = None


def use_planner(decide: Optional[Callable]) -> Optional[Callable]:
    """Installs `decide(config, role) -> bool` for "auto" (None uninstalls); returns the
    one it replaces."""
    global _planner
    before, _planner = _planner, decide
    return before


def decide(config, role: str, value) -> bool:
    """The bool `role`'s TrainConfig is built with from its config value `value` (True,
    False or "auto"), `config` being the run config it belongs to.

    Raises:
        ConfigError: "auto" with the planner installed but no run config to plan.
    """
    if value != REMAT_AUTO:
        return bool(value)
    if _planner is None:
        logging.info("config.%s.train.remat=auto -> True: the memory planner is not "
                     "installed in this process (memory.remat.install())", role)
        return True
    return _planner(config, role)
