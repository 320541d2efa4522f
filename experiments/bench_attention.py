r"""Compiled temporary memory of one attention call: materialised vs blockwise.

    python -m experiments.bench_attention            # Qwen3-8B layer: H=32, Hkv=8, Dh=128
    python -m experiments.bench_attention --small    # CPU-size layer: H=4, Hkv=2, Dh=64

For B=1 and each T in `--lengths` (default 1K, 4K, 8K, 24K; --small: 512 ... 4K), one
cache-free causal call (S = T, bfloat16, as in the policy's training forward and a prompt
prefill) is lowered and compiled, never run: the inputs are `jax.ShapeDtypeStruct`s, so the
24K materialised case (about 75 GB of float32 scores) only has to compile. Two programs
per implementation: the forward, and forward + backward (the gradient of a scalar loss
with respect to q, k and v). The number is XLA's
`compiled.memory_analysis().temp_size_in_bytes` for the default backend (inputs and
outputs excluded), so it shows how the temporaries scale: quadratically in T when
materialised, linearly when blockwise.

Output: one JSON object per (T, implementation) line, sizes in MiB:
    {"T", "impl", "block", "fwd_temp_mib", "fwd_bwd_temp_mib", "compile_s"}
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
from absl import flags
from experiments import cli  # noqa: E402

from drubric_jax.models import attention
from experiments.bench_common import emit

_SMALL = flags.DEFINE_bool("small", False, "CPU-size layer (H=4, Hkv=2, Dh=64)")
_LENGTHS = flags.DEFINE_list("lengths", None, "T values (default per --small)")
_BLOCK = flags.DEFINE_integer("block", 512, "blockwise query and key block length")


def temp_mib(fn, *args) -> float:
    """MiB of temporaries XLA reserves for `jax.jit(fn)(*args)` (compiled, not run)."""
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes / 2 ** 20


def measure(t: int, heads: int, kv_heads: int, head_dim: int, impl: str, block: int) -> dict:
    """One output line: the forward and forward+backward temp memory of `impl` at T = S = t."""
    q = jax.ShapeDtypeStruct((1, t, heads, head_dim), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, kv_heads, t, head_dim), jnp.bfloat16)
    valid = jax.ShapeDtypeStruct((1, t), jnp.bool_)
    if impl == "blockwise":
        attn = functools.partial(attention.blockwise, block_q=block, block_kv=block)
    else:
        attn = attention.materialized

    def loss(q, k, v, valid):
        return jnp.sum(attn(q, k, v, valid).astype(jnp.float32))

    begin = time.perf_counter()
    fwd = temp_mib(attn, q, kv, kv, valid)
    fwd_bwd = temp_mib(jax.grad(loss, argnums=(0, 1, 2)), q, kv, kv, valid)
    return {"T": t, "impl": impl, "block": block if impl == "blockwise" else None,
            "fwd_temp_mib": round(fwd, 1), "fwd_bwd_temp_mib": round(fwd_bwd, 1),
            "compile_s": round(time.perf_counter() - begin, 1)}


def main(argv):
    del argv
    heads, kv_heads, head_dim = (4, 2, 64) if _SMALL.value else (32, 8, 128)
    default = [512, 1024, 2048, 4096] if _SMALL.value else [1024, 4096, 8192, 24576]
    lengths = [int(x) for x in _LENGTHS.value] if _LENGTHS.value else default
    emit(backend=jax.default_backend(), H=heads, Hkv=kv_heads, Dh=head_dim, B=1,
         dtype="bfloat16")
    for t in lengths:
        for impl in ("materialized", "blockwise"):
            emit(**measure(t, heads, kv_heads, head_dim, impl, _BLOCK.value))


if __name__ == "__main__":
    cli.run(main)
