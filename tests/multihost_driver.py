"""One process of the multi-process loop test (tests/test_multihost.py); not a test itself.

    python tests/multihost_driver.py WORKDIR --num_processes=2 --process_id=0 --port=P
    python tests/multihost_driver.py WORKDIR --num_processes=1 --devices=8

Runs one tiny round (the config of `helpers.one_round_config`, hard verdicts from
`helpers.StubVerifier` so that groups are far from flat) on a (data, fsdp, tensor) =
(2, 2, 2) mesh of all the processes' fake CPU devices, with the export on. With
--num_processes > 1 it first joins `jax.distributed` on 127.0.0.1:PORT. --die_after_step=N
makes process --die_process end abruptly (os._exit, no cleanup: a host that died) right
after the checkpoint of optimizer step N is written.
"""
import argparse
import dataclasses
import os
import sys


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workdir")
    ap.add_argument("--num_processes", type=int, default=1)
    ap.add_argument("--process_id", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--devices", type=int, default=4, help="fake CPU devices per process")
    ap.add_argument("--die_after_step", type=int, default=0)
    ap.add_argument("--die_process", type=int, default=1)
    # Long enough that a live peer busy compiling on a loaded 2-core machine is not taken
    # for dead (10 s failed once under the full suite), short enough that a dead one is
    # found well within the test's 400 s per launch.
    ap.add_argument("--heartbeat_timeout_s", type=int, default=30)
    args = ap.parse_args()
    # Before JAX starts: this process's fake devices.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={args.devices}")
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.dirname(here)]
    import jax

    if args.num_processes > 1:
        jax.distributed.initialize(f"127.0.0.1:{args.port}", args.num_processes,
                                   args.process_id,
                                   heartbeat_timeout_seconds=args.heartbeat_timeout_s,
                                   shutdown_timeout_seconds=30)
    from drubric_jax.rounds import loop
    from helpers import StubVerifier, one_round_config

    c = one_round_config()
    c.verifier.verdict = "hard"
    # Every step's items split over 2 processes. Each row draws by its global row id
    # (per_row_keys), so the sampler micro-batches (2 rows per call: several calls, and on
    # one process calls padded with filler rows to data x fsdp = 4) lay the rows out
    # differently on 1 and 2 processes and must still give the same samples.
    c.policy.prompts_per_step, c.generator.anchors_per_step, c.generator.num_lists = 4, 2, 4
    c.per_row_keys = True
    c.policy.rollout_micro_batch = c.generator.rollout_micro_batch = 2
    c.mesh.num_devices = 0  # every device of every process
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 2, 2
    c.memory.park_idle_optimizer = False  # refused on several processes (config_check)
    c.export = True
    if args.die_after_step:
        save = loop.save

        def save_then_die(run):
            save(run)
            if (jax.process_index() == args.die_process
                    and run.loop.global_step >= args.die_after_step):
                print(f"process {args.die_process}: dying after step "
                      f"{run.loop.global_step}", flush=True)
                os._exit(17)

        loop.save = save_then_die
    if loop.finished(args.workdir, c) is not None:
        return
    run = loop.setup(c, args.workdir)
    run.ctx = dataclasses.replace(run.ctx, verifier=StubVerifier())
    try:
        loop.run_rounds(run)
    finally:
        loop.close(run)


if __name__ == "__main__":
    main()
