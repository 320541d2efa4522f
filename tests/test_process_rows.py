"""The process-row helpers of `drubric_jax.parallel` (issue 12: host-local rows) under two
`jax.distributed` processes on 127.0.0.1 (4 fake CPU devices each) against one process
with 8 devices: each process puts and reads back only its own rows, and the gathers give
every process the same global values (no model: a few seconds per launch); and the tiny
random-weight verifier judges each process's own rows and gives one process's P(yes)."""
import os

import numpy as np
import pytest

from helpers import launch_json

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "process_rows_driver.py")
TIMEOUT_S = 600  # a hang (a process waiting on its peer forever) fails; a loaded 2-core
# machine took about 110 s to launch both processes


def _launch(num_processes: int) -> list:
    return _launch_driver(DRIVER, num_processes)


def _launch_driver(driver: str, num_processes: int) -> list:
    return launch_json(driver, num_processes, timeout=TIMEOUT_S)


@pytest.mark.slow
def test_two_processes_hold_their_own_rows_and_gather_the_same_values():
    [one] = _launch(1)
    two = _launch(2)
    rows = [[r, r * r] for r in range(8)]
    doubled = [[2 * a, 2 * b] for a, b in rows]
    assert one["rows"] == [0, 8] and one["items"] == [0, 8]
    assert one["fetched"] == one["fetched_other"] == one["global"] == doubled
    for p, seen in enumerate(two):
        # Devices are grouped by process along the mesh's row axes: process p holds rows
        # 4p .. 4p + 3, the same block as its share of 8 items.
        assert seen["rows"] == seen["items"] == [4 * p, 4 * p + 4]
        assert seen["fetched"] == doubled[4 * p:4 * p + 4]  # its own rows, no collective
        assert seen["fetched_other"] == doubled[4 * p:4 * p + 4]
        assert seen["global"] == doubled
        assert seen["sum"] == one["sum"] == sum(a + b for a, b in rows)
        assert seen["agree_max"] == 20
        assert seen["gathered_rows"] == [0, 0, 1, 1]
        assert seen["gathered_texts"] == [f"process {q} row {i} \u00e9" * (i + 1)
                                          for q in range(2) for i in range(2)]
    assert one["agree_max"] == 10 and one["gathered_rows"] == [0, 0]


VERIFIER_DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                               "verifier_rows_driver.py")


@pytest.mark.slow
@pytest.mark.usefixtures("smollm2_gguf")
def test_two_processes_judge_their_own_rows_and_give_one_processs_p_yes():
    """The verifier under two processes (issue 12): each process tokenises only its share
    of the rows, the passes are planned from both processes' row lengths, and P(yes)
    equals one process's on 8 devices row for row (other bucket and pass layouts sum in
    another order: float32 ulps of P <= 1, as in test_verifier's mesh test)."""
    [one] = _launch_driver(VERIFIER_DRIVER, 1)
    two = _launch_driver(VERIFIER_DRIVER, 2)
    # Per-row draws: the same tokens whatever the calls' layout (row_ids).
    assert two[0]["sampled"] == two[1]["sampled"] == one["sampled"]
    for key in ("shared", "naive", "calibrated", "ids", "pairwise"):
        want = np.asarray(one[key])
        for seen in two:
            np.testing.assert_allclose(np.asarray(seen[key]), want, atol=1e-5, err_msg=key)
    # Each process's own rows: the first five on process 0, the last on process 1.
    own = np.asarray(one["own_rows"])
    np.testing.assert_allclose(np.asarray(two[0]["own_rows"]), own[:5], atol=1e-5)
    np.testing.assert_allclose(np.asarray(two[1]["own_rows"]), own[5:, :2], atol=1e-5)
    np.testing.assert_allclose(np.asarray(two[0]["empty_share"]), own, atol=1e-5)
    assert two[1]["empty_share"] == []
    assert two[0]["stats"] == two[1]["stats"] == one["stats"]  # summed over the processes
    assert one["stats"]["prefixes"] == 6 and one["stats"]["judgements"] == 12
    # Rows tokenised (shared, naive, calibrated with 6 null rows, own rows, empty share):
    # every row once, by its own process only.
    assert one["tokenised_rows"] == 6 + 6 + 12 + 6 + 6
    assert [p["tokenised_rows"] for p in two] == [3 + 3 + 6 + 5 + 6, 3 + 3 + 6 + 1 + 0]
