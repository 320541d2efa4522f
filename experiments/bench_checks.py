"""Host cost of checkable-item verdicts (`drubric_jax.checks.verdicts`): inline vs a thread
pool vs a warm process pool, on R seeded responses x M items.

    .venv/bin/python -m experiments.bench_checks                        # R=256, M=20, 2 workers
    .venv/bin/python -m experiments.bench_checks --loose --reps=5

Responses are R texts of 100-250 words of IFEval's keyword pool (seeded); the items are the
first M scorable checks with `draw_args` from the same seed. The three ways run
interleaved (`bench_common.paired_rounds`), and each prints one JSON line: median and
range of the seconds per call. The process pool uses the forkserver start (fork is unsafe
beside JAX's threads); its start-up is timed apart. The verdicts of every way are checked
equal.
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import statistics
import time

from absl import flags
from experiments import cli  # noqa: E402

from experiments import bench_common

_R = flags.DEFINE_integer("responses", 256, "R, responses")
_M = flags.DEFINE_integer("items", 20, "M, items (the first M scorable checks, at most 23)")
_WORKERS = flags.DEFINE_integer("workers", 2, "pool size")
_REPS = flags.DEFINE_integer("reps", 5, "interleaved rounds")
_LOOSE = flags.DEFINE_bool("loose", False, "IFEval's loose verdicts")
_SEED = flags.DEFINE_integer("seed", 0, "seed of the responses and arguments")


def _call(pool, checkers, responses, loose, n):
    from drubric_jax.checks import batch
    if pool is None:
        return batch._rows(checkers, responses, loose)
    step = -(-len(responses) // n)
    parts = [pool.submit(batch._rows, checkers, responses[i:i + step], loose)
             for i in range(0, len(responses), step)]
    return [row for f in parts for row in f.result()]


def main(argv):
    del argv
    import numpy as np

    from drubric_jax import checks

    rng = np.random.default_rng(_SEED.value)
    ids = checks.SCORABLE_CHECKS[:_M.value]
    items = [(c, checks.draw_args(c, rng, prompt="Write a poem.")) for c in ids]
    pool_words = checks.table.WORD_LIST
    responses = [" ".join(pool_words[j] for j in rng.integers(0, len(pool_words),
                                                              int(rng.integers(100, 251))))
                 for _ in range(_R.value)]
    checkers = [checks.verify.scorable_checker(c, a) for c, a in items]
    n, loose = _WORKERS.value, _LOOSE.value
    t = time.perf_counter()
    procs = cf.ProcessPoolExecutor(n, mp_context=mp.get_context("forkserver"))
    want = _call(procs, checkers, responses, loose, n)
    bench_common.emit(name="process_pool_start_and_first_call", workers=n,
                      seconds=round(time.perf_counter() - t, 3))
    threads = cf.ThreadPoolExecutor(n)

    def timer(pool):
        def fn():
            got, seconds = bench_common.timed(_call, pool, checkers, responses, loose, n)
            assert got == want, "verdicts differ between ways"
            return (seconds,)
        return fn

    rounds = bench_common.paired_rounds(
        {"inline": timer(None), "threads": timer(threads), "processes": timer(procs)},
        _REPS.value)
    for name, r in rounds.items():
        s = [x[0] for x in r["rounds"]]
        bench_common.emit(name=name, responses=_R.value, items=_M.value, workers=n, loose=loose,
                          median_s=round(statistics.median(s), 3), min_s=round(min(s), 3),
                          max_s=round(max(s), 3))
    procs.shutdown()
    threads.shutdown()


if __name__ == "__main__":
    cli.run(main)
