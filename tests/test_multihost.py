"""Two processes under `jax.distributed` (127.0.0.1, 4 fake CPU devices each) run the loop
as one process with 8 fake devices does, and a run that lost a process resumes.

Each process samples, constrained-decodes and trains on its own block of every step's
prompts and anchor lists (host-local rows); the texts the generator and the verifier read
are gathered. Equal metrics thus check that the blocks are assembled into the same global
batches and that advantages reach the right rows.

Each run is a subprocess of tests/multihost_driver.py (one tiny round on a (2, 2, 2) mesh
of all devices, export on). Marked slow: three tiny runs, two of them of two processes,
share the 2 CPU cores (about 4 minutes here).
"""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.usefixtures("smollm2_gguf"), pytest.mark.slow]

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_driver.py")
TIMEOUT_S = 400  # one launch; a hang (a process waiting on a dead peer forever) fails


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_processes(driver: str, num_processes: int, *args, timeout: float) -> list:
    """Starts `num_processes` processes of `driver` (its args, then --num_processes,
    --process_id, --port and --devices: 8 fake CPU devices shared out); returns
    [(returncode, output)] once all ended. Also used by tests/test_process_rows.py."""
    env = dict(os.environ)
    # The driver sets its own device count; the suite's 8-device flag would override it.
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if "device_count" not in f)
    port = _free_port()
    procs = [subprocess.Popen(
        [sys.executable, driver, *args, f"--num_processes={num_processes}",
         f"--process_id={i}", f"--port={port}", f"--devices={8 // num_processes}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for i in range(num_processes)]
    out = []
    try:
        for p in procs:
            text, _ = p.communicate(timeout=timeout)
            out.append((p.returncode, text))
    finally:
        for p in procs:
            p.kill()
    return out


def _launch(workdir, num_processes: int, *extra) -> list:
    return launch_processes(DRIVER, num_processes, str(workdir), *extra, timeout=TIMEOUT_S)


def _rows(workdir) -> dict:
    keep = ("loss", "kl", "grad_norm", "r_disc", "r_anchor", "policy_reward", "delta_gap",
            "heldout_r_anchor", "response_length_mean", "flat_group_fraction")
    rows = {}
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)  # the later row wins (a resumed run repeats some rows)
            rows[(r["kind"], r["round"], r["phase"], r["step"])] = {
                k: r[k] for k in keep if k in r}
    return rows


def _export(workdir) -> dict:
    from safetensors.numpy import load_file

    return {role: load_file(os.path.join(workdir, "export", role, "model.safetensors"))
            for role in ("policy", "generator")}


def test_two_processes_equal_one_process_and_resume_after_a_process_dies(tmp_path):
    """1 process x 8 devices, then 2 processes x 4 devices on the same global mesh: the
    second run's process 1 dies (os._exit) after the checkpoint of step 1; process 0 must
    then end with an error instead of waiting forever; the same command rerun resumes on
    both processes and finishes. Metrics agree within the (2, 2, 2)-mesh test's 1e-4
    relative (float32 sums in another order: in-process vs cross-process all-reduces), and
    the exported params within 2 x lr (what AdamW makes of such noise in one step each)."""
    from test_loop import _one_round_config

    one, two = tmp_path / "one", tmp_path / "two"
    [(rc, text)] = _launch(one, 1)
    assert rc == 0, text[-3000:]

    (rc0, text0), (rc1, text1) = _launch(two, 2, "--die_after_step=1")
    assert rc1 == 17 and "dying after step 1" in text1, text1[-3000:]
    assert rc0 != 0, "process 0 went on without its peer:\n" + text0[-3000:]
    # JAX's coordination service: "... detected fatal errors. This most likely indicates
    # that another task died", after "Task 1 heartbeat timeout".
    assert "another task died" in text0 and "heartbeat timeout" in text0, text0[-3000:]
    assert not os.path.exists(two / "finished.json")

    for rc, text in _launch(two, 2):  # the same command again: resumes from step 1
        assert rc == 0, text[-3000:]
    assert os.path.exists(two / "finished.json")

    rows_a, rows_b = _rows(one), _rows(two)
    assert rows_a.keys() == rows_b.keys()
    assert any(r.get("loss", 0) != 0 for r in rows_a.values())  # something was trained
    for key, ra in rows_a.items():
        for name, va in ra.items():
            assert rows_b[key][name] == pytest.approx(va, rel=1e-4, abs=1e-6), (key, name)
    c = _one_round_config()
    lr = max(c.policy.train.learning_rate, c.generator.train.learning_rate)
    ea, eb = _export(one), _export(two)
    for role in ea:
        assert ea[role].keys() == eb[role].keys()
        for name in ea[role]:
            diff = np.abs(ea[role][name].astype(np.float64) - eb[role][name]).max()
            assert diff <= 2 * lr + 1e-6, (role, name, diff)
