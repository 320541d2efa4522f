"""One process of tests/test_engine_processes.py (not a test itself): the rollout engine
(`sampling.generate_engine`) on a (data, fsdp, tensor) = (2, 2, 2) mesh of every
process's fake CPU devices, the tiny random model on its rollout copy; each process
passes its own block of the 8 rows and prints what it got back.

    python tests/engine_rows_driver.py --num_processes=2 --process_id=0 --port=P
    python tests/engine_rows_driver.py --num_processes=1 --devices=8

Prints one JSON line: this process's rows (tokens, mask, log-probs), unconstrained and
under a per-row constraint, the rows its `on_row_end` saw, and the static sampler's rows
(`generate_chunked`, the same row ids) unconstrained.
"""
import argparse
import json
import os
import sys


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num_processes", type=int, default=1)
    ap.add_argument("--process_id", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--devices", type=int, default=8, help="fake CPU devices per process")
    args = ap.parse_args()
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={args.devices}")
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.dirname(here)]
    import jax
    import numpy as np

    if args.num_processes > 1:
        jax.distributed.initialize(f"127.0.0.1:{args.port}", args.num_processes,
                                   args.process_id)
    from drubric_jax import models, parallel, sampling
    from drubric_jax.models import config, rollout
    from helpers import RowRule

    cfg = config.TINY
    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    host = jax.device_get(models.init_params(cfg, jax.random.PRNGKey(0)))
    params = jax.tree.map(parallel.put, host, models.param_shardings(host, mesh))
    weights = rollout.rollout_copy(params, cfg, mesh)
    rng = np.random.default_rng(0)
    # 8 rows: 4 prompts x K = 2 (a prompt's rows consecutive), lengths in two buckets.
    prompts = [rng.integers(3, cfg.vocab_size, size=n).tolist() for n in (5, 20, 9, 3)]
    rows = [p for p in prompts for _ in range(2)]
    ids = [100 + 3 * r for r in range(len(rows))]
    block = parallel.process_block(len(rows))
    out = {"block": [block.start, block.stop]}
    kw = dict(key=jax.random.PRNGKey(4), max_new_tokens=6, method=sampling.Temperature(1.0),
              # A fifth of the ids stop a row: random weights then give lengths of 1 to N.
              stop_ids=list(range(2, cfg.vocab_size, 5)), num_slots=4, mesh=mesh,
              steps_per_call=2)
    for name, extra in (("free", {}), ("constrained", {"constraint": RowRule(cfg.vocab_size, 4)})):
        ended = []
        got = sampling.generate_engine(weights, cfg, rows[block], row_ids=ids[block],
                                       on_row_end=lambda row, slot: ended.append(row),
                                       **kw, **extra)
        out[name] = {"tokens": got.tokens.tolist(), "mask": got.mask.tolist(),
                     "logprobs": got.logprobs.tolist(), "lengths": got.lengths.tolist(),
                     "prompt_tokens": got.prompt_tokens.tolist(), "ended": sorted(ended)}
    # The static sampler on the same rows and row ids (what a run with sampler "static"
    # samples): a call of this process's rows.
    kw.pop("num_slots"), kw.pop("steps_per_call")
    static = sampling.generate_chunked(weights, cfg, rows[block], len(rows[block]),
                                       row_ids=ids[block], **kw)
    out["static"] = {"tokens": static.tokens.tolist(), "mask": static.mask.tolist(),
                     "logprobs": static.logprobs.tolist()}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
