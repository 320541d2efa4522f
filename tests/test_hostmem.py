"""Tests of the glibc host-memory helpers (drubric_jax/rounds/hostmem.py)."""
import ctypes.util
import sys

import numpy as np
import pytest

from drubric_jax.rounds import hostmem

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None
    or hostmem._libc() is None, reason="glibc malloc only (Linux)")


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@glibc
def test_configure_and_release_on_cpu():
    assert hostmem.configure_malloc()
    assert isinstance(hostmem.release_free_memory(), bool)
    # VmHWM and VmRSS are sampled kernel counters (proc(5)): compare loosely.
    assert hostmem.peak_rss_bytes() >= 0.9 * _rss_bytes() > 0


@glibc
def test_freed_large_buffer_leaves_the_resident_set():
    """With the fixed mmap threshold a freed 256 MiB buffer is returned to the kernel."""
    hostmem.configure_malloc()
    hostmem.release_free_memory()
    before = _rss_bytes()
    buf = np.ones(256 << 20, np.uint8)
    assert _rss_bytes() - before > 200 << 20  # the pages are resident while it lives
    del buf
    hostmem.release_free_memory()
    assert _rss_bytes() - before < 64 << 20


def test_park_unpark_round_trip_bitwise(tmp_path):
    """Parked leaves are read-only memmaps on disk; unpark restores values, dtypes
    (bfloat16 included) and shardings exactly; scalars are left in place."""
    import jax
    import jax.numpy as jnp

    tree = {"mu": jax.random.normal(jax.random.PRNGKey(0), (64, 8)).astype(jnp.bfloat16),
            "nu": jax.random.uniform(jax.random.PRNGKey(1), (3, 5, 7)),
            "count": jnp.int32(7)}
    shardings = jax.tree.map(lambda x: x.sharding, tree)
    directory = str(tmp_path / "parked")
    parked = hostmem.park(tree, directory)
    assert isinstance(parked["mu"], np.memmap) and isinstance(parked["nu"], np.memmap)
    assert not parked["nu"].flags.writeable
    assert parked["count"] is tree["count"]
    back = hostmem.unpark(parked, shardings, directory)
    for k in tree:
        assert isinstance(back[k], jax.Array) and back[k].dtype == tree[k].dtype
        assert back[k].sharding == tree[k].sharding
        np.testing.assert_array_equal(np.atleast_1d(np.asarray(back[k])).view(np.uint8),
                                      np.atleast_1d(np.asarray(tree[k])).view(np.uint8))
    assert not (tmp_path / "parked").exists()
