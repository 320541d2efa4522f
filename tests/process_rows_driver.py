"""One process of tests/test_process_rows.py (not a test itself): the process-row helpers
of `drubric_jax.parallel` on a (data, fsdp, tensor) = (2, 2, 2) mesh of every process's
fake CPU devices.

    python tests/process_rows_driver.py --num_processes=2 --process_id=0 --port=P
    python tests/process_rows_driver.py --num_processes=1 --devices=8

Prints one JSON line (what this process saw) for the test to compare.
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
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import jax
    import jax.numpy as jnp
    import numpy as np

    if args.num_processes > 1:
        jax.distributed.initialize(f"127.0.0.1:{args.port}", args.num_processes,
                                   args.process_id)
    from jax.sharding import NamedSharding, PartitionSpec

    from drubric_jax import parallel

    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    rows = parallel.batch_sharding(mesh)
    n, p = 8, jax.process_index()
    block = parallel.process_rows(n, mesh)
    items = parallel.process_block(n)
    # Row r of the global batch holds r (and its square in a second column).
    local = np.stack([np.arange(block.start, block.stop)] * 2, axis=1).astype(np.int32)
    local[:, 1] **= 2
    x = parallel.put_process_rows(local, mesh, n)
    doubled = jax.jit(lambda a: 2 * a, out_shardings=parallel.batch_sharding(mesh))(x)
    total = int(parallel.fetch(jax.jit(jnp.sum)(x)))  # a replicated scalar
    texts = [f"process {p} row {i} \u00e9" * (i + 1) for i in range(2)]
    print(json.dumps({
        "process": p, "rows": [block.start, block.stop], "items": [items.start, items.stop],
        "fetched": parallel.fetch_process_rows(doubled, rows).tolist(),
        # Laid out otherwise (rows over "tensor" only): gathered, then cut to this block.
        "fetched_other": parallel.fetch_process_rows(
            jax.device_put(doubled, NamedSharding(mesh, PartitionSpec("tensor"))),
            rows).tolist(),
        "global": parallel.fetch(doubled).tolist(), "sum": total,
        "agree_max": parallel.agree_max(10 * (p + 1)),
        "gathered_rows": parallel.gather_rows(np.array([p, p], np.int32)).tolist(),
        "gathered_texts": parallel.gather_texts(texts)}), flush=True)


if __name__ == "__main__":
    main()
