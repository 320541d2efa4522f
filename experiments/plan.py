r"""Memory plan of a run config: GB per device of every role and step, and a verdict.

    python -m experiments.plan --config=configs/qwen3_8b.py:lora --devices=1 \
        --device_memory_gb=141 --attention=blockwise
    python -m experiments.plan --config=configs/qwen3_8b.py --devices=8 \
        --device_memory_gb=80 --mesh=1,8,1 --attention=blockwise
    python -m experiments.plan --config=configs/smollm2_cpu.py:tiny --devices=8 --compile
    python -m experiments.plan --config=configs/qwen3_8b.py:lora --devices=1 \
        --device_memory_gb=141 --time=H200        # + seconds per step and hours per round

Prints the resident state per phase, each step's transient terms and peak (an update per
row or in groups sharing a prefix, as `train.shared_prefix` says), the rollout and update
micro-batches it picked (the largest that fit), what `train.remat="auto"` comes out as for
each trainee on these devices, and FITS / DOES-NOT-FIT naming the largest term and the
config field that shrinks it (`drubric_jax.memory.planner`). With
--compile the real jitted functions are compiled on N fake CPU devices and their XLA
memory analysis is printed beside each step (`drubric_jax.memory.compiled`; deep models
are compiled at 2 and 4 layers and scaled; on CPU bfloat16 matmuls get float32 operand
copies, so a bfloat16 model's compiled figure is an upper bound). With --time=KIND the
device work of a generator step, a policy step and a round is estimated from FLOPs and
bytes against KIND's peaks (`drubric_jax.memory.timing`), beside public anchors; each
update is printed as the config runs it and, marked `*` and outside the totals, in the
other layout (per row against grouped).
"""
import os
import sys


def _device_count(argv) -> int:
    """--devices=N or --devices N of the command line (1 without it)."""
    for i, arg in enumerate(argv):
        if arg.startswith("--devices="):
            return int(arg.split("=", 1)[1])
        if arg == "--devices" and i + 1 < len(argv):
            return int(argv[i + 1])
    return 1


# N fake CPU devices, before jax is imported (the mesh needs them to compile on).
if "jax" not in sys.modules:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform"
                               f"_device_count={_device_count(sys.argv)}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402
from experiments import cli  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).")
_DEVICES = flags.DEFINE_integer("devices", 1, "N, devices of the mesh.")
_MEMORY = flags.DEFINE_float("device_memory_gb", None, "Memory per device, GB (1e9 bytes).")
_MESH = flags.DEFINE_string("mesh", "", "data,fsdp,tensor (default: config.mesh on N).")
_ATTENTION = flags.DEFINE_enum("attention", "auto", ["auto", "dense", "blockwise"],
                               "Attention to plan for (ModelConfig.attention; auto: "
                               "blockwise for long rows, as the code runs by default).")
_BLOCK = flags.DEFINE_integer("attention_block", 512, "Key tile of blockwise attention.")
_HEADROOM = flags.DEFINE_float("headroom", 0.10, "Fraction of the memory kept free.")
_SEARCH = flags.DEFINE_bool("search", True, "Pick rollout and update micro-batches; else "
                            "plan what the config does (its rollout and update micro-batches).")
_BACKEND = flags.DEFINE_enum("backend", "gpu", ["cpu", "gpu", "tpu"],
                             "The platform planned for: CPU and GPU decode on per-layer copies "
                             "of the rollout weights and KV cache, TPU does not.")
_COMPILE = flags.DEFINE_bool("compile", False, "Also compile the steps on N fake devices.")
_TIME = flags.DEFINE_string("time", None, "Also estimate the time of a generator step, a "
                            "policy step and a round on N devices of this kind (a key of "
                            "drubric_jax.memory.costs.TARGETS: H200, H100, TPU_v5p, ...; "
                            "_ stands for a space).")
_LENGTHS_FROM = flags.DEFINE_string(
    "lengths_from", None, "With --time: a run directory whose metrics.jsonl gives the "
    "policy's and the generator's response-length quantiles (config.policy and "
    "config.generator response_lengths are set from them; decode steps are then counted "
    "from the lengths, not N for every row).")
flags.mark_flags_as_required(["config"])


def main(argv):
    del argv
    import jax

    from drubric_jax import parallel
    from drubric_jax.memory import planner
    from drubric_jax.memory import compiled as planner_compiled
    from drubric_jax.memory.planner import Workload
    from drubric_jax.memory.terms import RoleModels

    sizes = tuple(int(x) for x in _MESH.value.split(",")) if _MESH.value else None
    config = _CONFIG.value
    p = planner.plan(config, _DEVICES.value, _MEMORY.value, sizes, _ATTENTION.value,
                     _BLOCK.value, _HEADROOM.value, _SEARCH.value, backend=_BACKEND.value)
    # The config as planned: train.remat "auto" decided for these devices and this memory.
    config = p.config
    if _COMPILE.value:
        mesh = parallel.make_mesh(*p.mesh.values(), jax.devices()[:_DEVICES.value])
        planner_compiled.measure_plan(p, RoleModels.from_config(config),
                                      Workload.from_config(config), mesh)
    print(p.table())
    if _TIME.value:
        from drubric_jax.memory import costs, timing

        target = costs.target(_TIME.value.replace("_", " "))  # TPU_v5p = "TPU v5p"
        if target is None:
            raise app.UsageError(f"--time={_TIME.value!r}: not one of {sorted(costs.TARGETS)}")
        if _LENGTHS_FROM.value:
            from drubric_jax.rounds.run_logging import read_metrics
            from drubric_jax.sampling.lengths import role_specs

            path = os.path.join(_LENGTHS_FROM.value, "metrics.jsonl")
            specs = role_specs(read_metrics(path), {r: config[r].max_new_tokens
                                                    for r in ("policy", "generator")}, path)
            for role in ("policy", "generator"):
                if role not in specs:
                    print(f"{role} lengths: none logged in {path}; its rows run to N")
                    continue
                with config.unlocked():
                    config[role].response_lengths = specs[role]
                print(f"{role} response lengths from {path}: {specs[role]}")
        # The engine's slots as planned for this memory (the sampling steps' rows).
        slots = {(f"{s.phase} step", "policy" if s.name == "policy sampling" else "generator"):
                 s.rows for s in p.steps if s.name in ("policy sampling", "rubric sampling")}
        times = timing.estimate(config, RoleModels.from_config(config), target, _DEVICES.value,
                                p.mesh["tensor"], slots)
        print()
        print(timing.table(config, times, target, _DEVICES.value))


if __name__ == "__main__":
    cli.run(main)
