r"""Compiled memory of the mixture-of-experts verifier's passes, on one device and sharded.

    python -m experiments.bench_moe                       # 2-layer Qwen3-30B-A3B, float32
    python -m experiments.bench_moe --lengths=2048,4096,8192 --devices=1,8

For each device count N in `--devices` (N fake CPU devices: the flag sets
`--xla_force_host_platform_device_count` before jax starts; mesh data 1 x fsdp N) and each
prefix length T in `--lengths`, one verifier chunk of one row a device (`evaluator.passes`
prefill of T tokens, then the suffix pass of `--items` items of 64 tokens, under
`parallel.rows_on` as the verifier runs them) is lowered on abstract inputs and compiled,
never run: `memory.compiled.verification_peaks` gives XLA's bytes a device beyond the
params for each pass. The per-token growth of the prefill shows whether each device
dispatches only its own tokens (`models.qwen3_moe.dispatch_groups`): then it matches the
one-device program's. Sizes: `--layers` layers (the figures are per program, not scaled
to 48 layers), `--dtype` params and compute.

Output: one JSON object per (N, T) line:
    {"devices", "prefix", "items", "prefill_gb", "suffix_gb", "compile_s"}
"""
from __future__ import annotations

import os
import sys


def _device_flag() -> None:
    # The fake device count must be set before jax is imported (here, not in main).
    given = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--devices=")]
    wanted = max(int(x) for x in (given[-1] if given else "1,8").split(",") if x)
    flags_ = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags_:
        os.environ["XLA_FLAGS"] = (flags_ + f" --xla_force_host_platform_device_count="
                                   f"{wanted}").strip()


_device_flag()

import dataclasses  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
from absl import app, flags  # noqa: E402
from experiments import cli  # noqa: E402

from experiments.bench_common import emit  # noqa: E402

_DEVICES = flags.DEFINE_list("devices", ["1", "8"], "device counts (fsdp = N)")
_LENGTHS = flags.DEFINE_list("lengths", ["2048", "4096"], "prefix lengths T, tokens")
_ITEMS = flags.DEFINE_integer("items", 16, "items of the suffix pass")
_LAYERS = flags.DEFINE_integer("layers", 2, "layers of Qwen3-30B-A3B compiled")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "params and compute (bfloat16 on CPU carries float32 copies)")


def main(argv):
    del argv
    from drubric_jax import parallel
    from drubric_jax.memory import compiled
    from drubric_jax.models.config import QWEN3_30B_A3B

    cfg = dataclasses.replace(QWEN3_30B_A3B, num_layers=_LAYERS.value, dtype=_DTYPE.value,
                              param_dtype=_DTYPE.value)
    for n in (int(x) for x in _DEVICES.value):
        if n > jax.device_count():
            raise app.UsageError(f"--devices={n}: only {jax.device_count()} devices here")
        mesh = parallel.make_mesh(1, n, 1, jax.devices()[:n])
        params = compiled.param_structs(cfg, mesh)
        for t in (int(x) for x in _LENGTHS.value):
            begin = time.perf_counter()
            pre, suffix = compiled.verification_peaks(cfg, params, n, t, 64, _ITEMS.value, mesh)
            emit(devices=n, prefix=t, items=_ITEMS.value, prefill_gb=round(pre / 1e9, 3),
                 suffix_gb=round(suffix / 1e9, 3),
                 compile_s=round(time.perf_counter() - begin, 1))


if __name__ == "__main__":
    cli.run(main)
