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

import numpy as np
import pytest

from helpers import launch_processes, one_round_config

pytestmark = [pytest.mark.usefixtures("smollm2_gguf"), pytest.mark.slow]

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_driver.py")
TIMEOUT_S = 400  # one launch; a hang (a process waiting on a dead peer forever) fails


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
    then end with an error instead of waiting forever (within TIMEOUT_S: `launch_processes`
    raises on a hang), without finishing the run; the same command rerun resumes on both
    processes and finishes. Metrics agree within the (2, 2, 2)-mesh test's 1e-4
    relative (float32 sums in another order: in-process vs cross-process all-reduces), and
    the exported params within 2 x lr (what AdamW makes of such noise in one step each)."""
    one, two = tmp_path / "one", tmp_path / "two"
    [(rc, text)] = _launch(one, 1)
    assert rc == 0, text[-3000:]

    (rc0, text0), (rc1, text1) = _launch(two, 2, "--die_after_step=1")
    assert rc1 == 17 and "dying after step 1" in text1, text1[-3000:]
    # Process 0 failed by itself (not the driver's exit code 17 of the process that died),
    # and neither finished the run nor printed the line a finished run ends with.
    assert rc0 not in (0, 17), "process 0 went on without its peer:\n" + text0[-3000:]
    assert "finished 1 round" not in text0, text0[-3000:]
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
    c = one_round_config()
    lr = max(c.policy.train.learning_rate, c.generator.train.learning_rate)
    ea, eb = _export(one), _export(two)
    for role in ea:
        assert ea[role].keys() == eb[role].keys()
        for name in ea[role]:
            diff = np.abs(ea[role][name].astype(np.float64) - eb[role][name]).max()
            assert diff <= 2 * lr + 1e-6, (role, name, diff)
