"""The persistent compilation cache and the compile clock (drubric_jax/rounds/compilation.py)."""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp

from drubric_jax.rounds import compilation


def test_compile_clock_counts_a_new_compilation():
    compilation.CompileClock.install()
    compilation.CompileClock.install()  # idempotent
    before = compilation.CompileClock.seconds()
    jax.jit(lambda x: jnp.sin(x) * 3.0 + x.sum())(jnp.arange(7.0)).block_until_ready()
    assert compilation.CompileClock.seconds() > before


def test_persistent_cache_is_written_and_read_by_a_new_process(tmp_path):
    """Two fresh processes compile the same function: the first misses and writes the
    cache, the second loads it (JAX's own cache_hits / cache_misses events)."""
    script = textwrap.dedent(f"""
        import jax, jax.numpy as jnp
        from drubric_jax.rounds import compilation
        counts = {{}}
        jax.monitoring.register_event_listener(
            lambda e, **kw: counts.__setitem__(e, counts.get(e, 0) + 1))
        compilation.enable_persistent_cache({str(tmp_path)!r}, min_compile_seconds=0.0)
        f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())
        f(jnp.ones((64, 64))).block_until_ready()
        print(counts.get("/jax/compilation_cache/cache_hits", 0),
              counts.get("/jax/compilation_cache/cache_misses", 0))
    """)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    seen = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             env=env, cwd=os.path.dirname(os.path.dirname(__file__)))
        assert out.returncode == 0, out.stderr
        seen.append(tuple(int(x) for x in out.stdout.split()[-2:]))
    assert seen[0][1] >= 1 and seen[1][0] >= 1, seen  # miss, then hit
