"""One process of tests/test_engine.py::test_each_program_compiles_once_in_a_fresh_process
(not a test itself): two rollouts of the engine in a fresh process, counting every program
XLA compiles (`jax_log_compiles`: JAX logs each compilation with its function's name).

    python tests/engine_compiles_driver.py

Prints one JSON line: {"first": {name: compiles}, "second": {name: compiles},
"read_pages": [each rollout's decode read buckets], "buckets": the prompt buckets}.
"""
import collections
import json
import logging
import os
import re
import sys


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.dirname(here)]
    import jax
    import numpy as np

    jax.config.update("jax_log_compiles", True)
    counts = collections.Counter()

    class Count(logging.Handler):
        def emit(self, record):
            m = re.match(r"Compiling jit\(([\w.<>]+)\)", record.getMessage())
            if m:
                counts[m.group(1)] += 1

    logging.getLogger("jax").addHandler(Count())
    from drubric_jax import sampling
    from drubric_jax.models import config, init_params

    cfg = config.TINY
    params = init_params(cfg, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    # Prompts of three buckets (16, 32, 64), K = 2 rows each.
    lengths = (3, 20, 40, 7, 18, 33)
    prompts = [rng.integers(3, cfg.vocab_size, size=n).tolist() for n in lengths]
    rows = [p for p in prompts for _ in range(2)]
    kw = dict(key=jax.random.PRNGKey(1), max_new_tokens=10, method=sampling.Temperature(1.0),
              stop_ids=list(range(2, cfg.vocab_size, 7)), num_slots=3, steps_per_call=3)
    stats = {}
    sampling.generate_engine(params, cfg, rows, row_ids=list(range(len(rows))), stats=stats,
                             **kw)
    first = dict(counts)
    counts.clear()
    # The same shapes again, other rows in another order: nothing new to compile.
    again = {}
    sampling.generate_engine(params, cfg, rows[::-1], row_ids=list(range(50, 50 + len(rows))),
                             stats=again, **kw)
    print(json.dumps({"first": first, "second": dict(counts),
                      "read_pages": [sorted(stats["read_pages"]),
                                     sorted(again["read_pages"])],
                      "buckets": sorted({sampling.bucket_length(n, 16) for n in lengths})}))


if __name__ == "__main__":
    main()
