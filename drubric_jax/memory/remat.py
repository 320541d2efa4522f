"""`train.remat` decided from memory (issue 54): "auto" recomputes each layer in the
backward pass only where the role's update, planned with every layer's activations saved,
does not fit the device (`remat_choice`, the figures `planner.plan` gives its verdict
with). `resolve_remat` decides it for a run on this machine; `install` hands it to the run
(`rounds.remat`, which builds each TrainConfig's bool: the run cannot import this layer).

Memory: an accelerator's `bytes_limit`, on CPU the host's available memory
(`host_memory_bytes`) shared by the mesh's devices on the host.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional

import jax
import ml_collections
from absl import logging

from drubric_jax.memory.terms import GB, RoleModels, abstract_mesh, resident_terms
from drubric_jax.memory.workload import (DEFAULT_BLOCK, DEFAULT_HEADROOM, PHASES, Workload,
                                         update_step)
from drubric_jax.rl.train_config import REMAT_AUTO
from drubric_jax.types import require


@dataclasses.dataclass(frozen=True)
class RematChoice:
    """`config.<role>.train.remat` as the update runs it (`remat_choice`).

    setting  the config's value: True, False or "auto"
    remat    what the update runs with
    peak     "auto" only: bytes per device at the update's peak with every layer's
             activations saved (its phase's resident state + the step's transients at the
             config's micro-batch); None when the device memory is unknown
    usable   "auto" only: the device memory less the headroom, bytes (None: unknown)
    memory   where the capacity came from ("80.0 GB per device" for a plan, "18.9 GB
             available host memory" or "NVIDIA H100 80GB HBM3 bytes_limit" for a run)
    """

    role: str
    setting: object
    remat: bool
    peak: Optional[int] = None
    usable: Optional[int] = None
    memory: str = ""

    def describe(self) -> str:
        """"config.policy.train.remat=auto -> False: ..." (why, for "auto")."""
        head = f"config.{self.role}.train.remat={self.setting} -> {self.remat}"
        if self.setting != REMAT_AUTO:
            return f"{head} (set in the config)"
        if self.usable is None:
            return f"{head}: device memory unknown, recompute to be safe"
        verb = "fits" if not self.remat else "does not fit"
        sign = "<=" if not self.remat else ">"
        return (f"{head}: the update's peak with saved activations, {self.peak / GB:.2f} GB "
                f"per device, {verb} ({sign} {self.usable / GB:.2f} GB usable of {self.memory})")


def with_remat(config: ml_collections.ConfigDict, remat: dict) -> ml_collections.ConfigDict:
    """A copy of `config` whose `<role>.train.remat` is `remat[role]` for each role given
    (a new node: the config's own field may be typed str, holding "auto")."""
    out = ml_collections.ConfigDict(config.to_dict())
    for role, value in remat.items():
        out[role].train = ml_collections.ConfigDict({**out[role].train.to_dict(),
                                                     "remat": bool(value)})
    return out


def remat_choice(config: ml_collections.ConfigDict, role: str, devices: int,
                 device_memory_gb: Optional[float], mesh_sizes: Optional[tuple] = None,
                 attention: str = "auto", block: int = DEFAULT_BLOCK,
                 headroom: float = DEFAULT_HEADROOM, backend: Optional[str] = None,
                 memory: str = "") -> RematChoice:
    """`config.<role>.train.remat` decided (issue 54): True and False stand; "auto" is
    False (every layer keeps its activations for the backward, no recomputed forward)
    exactly when the role's update step, planned that way at the config's own micro-batch,
    fits the device: its phase's resident state plus the step's transients (`update_step`)
    within `device_memory_gb` less `headroom` (the budget `plan` gives its verdict
    against). Unknown memory (None): True.

    Args:
        config: a run config (configs/base.py layout).
        role: "policy" | "generator".
        devices, mesh_sizes, attention, block, headroom, backend: as `plan`.
        memory: where device_memory_gb came from, for `RematChoice.describe`.
    """
    setting = config[role].train.remat
    if setting != REMAT_AUTO:
        return RematChoice(role, setting, bool(setting))
    if device_memory_gb is None:
        return RematChoice(role, setting, True)
    # Both roles' remat set (the other role's does not enter this role's update step).
    trial = with_remat(config, {r: False for r in PHASES})
    mesh = abstract_mesh(trial, devices, mesh_sizes)
    models_ = RoleModels.from_config(trial)
    step = update_step(models_, Workload.from_config(trial), role, mesh, attention, block,
                       backend or jax.default_backend(),
                       micro_batch=models_.train[role].micro_batch_size)
    peak = sum(t.bytes for t in resident_terms(models_, trial, mesh, role)[0]) + step.transient
    usable = int(device_memory_gb * GB * (1 - headroom))
    return RematChoice(role, setting, peak > usable, peak, usable,
                       memory or f"{device_memory_gb:.1f} GB per device")


def host_memory_bytes() -> tuple[int, str]:
    """(bytes, what) a process starting on this host can have: /proc/meminfo's MemAvailable
    (free memory plus what the kernel can reclaim: a host shared with other work counts
    only what they leave), within the cgroup's limit less its usage (cgroup v2
    memory.max - memory.current, or v1 memory.limit_in_bytes - memory.usage_in_bytes);
    the physical memory where neither is readable (not Linux)."""
    avail, what = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory"
    try:
        with open("/proc/meminfo") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        avail, what = kb * 1024, "available host memory"
    except (OSError, StopIteration, ValueError):
        pass
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit) as f, open(usage) as g:
                room = int(f.read().strip()) - int(g.read().strip())
        except (OSError, ValueError):  # absent, or "max" (no limit)
            continue
        if room < avail:
            avail, what = room, "room in the cgroup's memory limit"
        break
    return avail, what


def run_memory_gb(devices: int) -> tuple[float, str]:
    """(GB per device, where from) that a run on this machine has: an accelerator's
    `bytes_limit` (`memory_stats()`: what XLA's allocator may take, after
    XLA_PYTHON_CLIENT_MEM_FRACTION), or on CPU the host's memory (`host_memory_bytes`)
    shared by the mesh's devices on this host."""
    local = jax.local_devices()
    stats = local[0].memory_stats() or {}
    if "bytes_limit" in stats:
        return stats["bytes_limit"] / GB, f"{local[0].device_kind} bytes_limit"
    host, what = host_memory_bytes()
    sharing = max(1, min(devices, len(local)))
    share = f", shared by {sharing} devices" if sharing > 1 else ""
    return host / sharing / GB, f"{host / GB:.1f} GB {what}{share}"


def resolve_remat(config: ml_collections.ConfigDict, role: str, value=None) -> bool:
    """The bool a run builds `role`'s TrainConfig with from `config.<role>.train.remat`
    (or `value`): True and False as they are; "auto" decided by `remat_choice` on the
    machine the run is on: the mesh's devices (`config.mesh.num_devices`, 0 = all) and
    `run_memory_gb`; the decision is logged (absl INFO, among the run's setup lines).

    Raises:
        ConfigError: "auto" without the run config to plan it from.
    """
    require(config is not None or value not in (None, REMAT_AUTO), f"config.{role}.train.remat",
            "'auto' is decided from the whole run config: pass it "
            "(rounds.settings.train_config(..., config=config))")
    value = config[role].train.remat if value is None else value
    if value != REMAT_AUTO:
        return bool(value)
    devices = config.mesh.num_devices or jax.device_count()
    gb, where = run_memory_gb(devices)
    choice = remat_choice(config, role, devices, gb, memory=where)
    logging.info("%s", choice.describe())
    return choice.remat


def install() -> None:
    """Hands `resolve_remat` to the run (`rounds.remat.use_planner`): from then on, in this
    process, each trainee's TrainConfig built from a config that says "auto" gets the
    planner's decision. Every experiment entry point calls it (`experiments.cli.run`)."""
    from drubric_jax.rounds import remat as run_remat

    run_remat.use_planner(resolve_remat)
