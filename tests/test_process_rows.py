"""The process-row helpers of `drubric_jax.sharding` (issue 12: host-local rows) under two
`jax.distributed` processes on 127.0.0.1 (4 fake CPU devices each) against one process
with 8 devices: each process puts and reads back only its own rows, and the gathers give
every process the same global values. No model: a few seconds per launch."""
import json
import os

import pytest
from test_multihost import launch_processes

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "process_rows_driver.py")
TIMEOUT_S = 120  # a hang (a process waiting on its peer forever) fails


def _launch(num_processes: int) -> list:
    out = []
    for rc, text in launch_processes(DRIVER, num_processes, timeout=TIMEOUT_S):
        assert rc == 0, text[-3000:]
        out.append(json.loads([ln for ln in text.splitlines() if ln.startswith("{")][-1]))
    return out


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
