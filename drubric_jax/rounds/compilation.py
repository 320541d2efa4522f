"""Compilation: JAX's persistent compilation cache, and the compile seconds of a run.

A new process (a resumed run, the next sweep entry, the test suite) loads compiled
programs from `cache_dir` instead of compiling them again: on this 2-core CPU a SmolLM2
sampler shape takes 4-5 s to compile and well under a second to load.

`CompileClock` adds up JAX's own monitoring events for tracing, lowering and XLA compiling
(`jax.monitoring`), so each step's metrics can say how much of its wall time was
compilation (`seconds_compile`), whether or not the cache served it.
"""
from __future__ import annotations

import os
import threading

import jax

# jax/_src/dispatch.py: the events JAX records for every compilation.
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")


def enable_persistent_cache(cache_dir: str, min_compile_seconds: float = 0.5) -> None:
    """Turns on JAX's persistent compilation cache in `cache_dir` ("" leaves it off).

    The one place that sets the cache (the round loop, the evaluator benchmark,
    experiments.eval_policy and experiments.bench_sampler call it). `cache_dir` may start
    with "~"; the directory is created if missing. Programs that compile in under
    `min_compile_seconds` are not written (cheap to redo).
    """
    if not cache_dir:
        return
    path = os.path.expanduser(cache_dir)
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)


class CompileClock:
    """Cumulative seconds JAX spent tracing, lowering and compiling in this process."""

    # Listener calls may come from several threads.
    _lock = threading.Lock()
    _seconds = 0.0
    _installed = False

    @classmethod
    def install(cls) -> None:
        """Registers the listener once per process."""
        with cls._lock:
            # Once per process: a second listener would count every event twice.
            if cls._installed:
                return
            cls._installed = True

        def listen(event: str, duration: float, **kwargs) -> None:
            if event in COMPILE_EVENTS:
                with cls._lock:
                    cls._seconds += duration

        jax.monitoring.register_event_duration_secs_listener(listen)

    @classmethod
    def seconds(cls) -> float:
        with cls._lock:
            return cls._seconds
