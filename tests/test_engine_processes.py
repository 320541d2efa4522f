"""The rollout engine (`sampling.generate_engine`) under two `jax.distributed` processes
on 127.0.0.1 (4 fake CPU devices each) against one process with 8 devices, on the same
(data, fsdp, tensor) = (2, 2, 2) mesh (tests/engine_rows_driver.py): each process passes
its own block of rows and gets the rows one process gives them."""
import os

import numpy as np
import pytest

from helpers import launch_json
from tolerances import logprob_atol

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine_rows_driver.py")
TIMEOUT_S = 600  # a hang (a process waiting on its peer forever) fails


def _launch(num_processes: int) -> list:
    return launch_json(DRIVER, num_processes, timeout=TIMEOUT_S)


@pytest.mark.slow
def test_two_processes_get_the_rows_one_process_gives():
    """Rows and their order, unconstrained and under a per-row constraint (every process
    runs every slot's matcher), equal one process's; log-probs within float32 rounding;
    each process's `on_row_end` sees its own rows only, by their index in its block; and
    the unconstrained rows of either layout equal the static sampler's
    (`generate_chunked`, the same row ids) on one process."""
    from drubric_jax.models.config import TINY

    [one] = _launch(1)
    two = _launch(2)
    assert one["block"] == [0, 8] and [p["block"] for p in two] == [[0, 4], [4, 8]]
    for name in ("free", "constrained"):
        want = one[name]
        assert want["ended"] == list(range(8))
        lengths = want["lengths"]
        assert min(lengths) < max(lengths), lengths  # rows end at different steps
        for p in two:
            lo, hi = p["block"]
            got = p[name]
            assert got["tokens"] == want["tokens"][lo:hi], name
            assert got["mask"] == want["mask"][lo:hi]
            assert got["prompt_tokens"] == want["prompt_tokens"][lo:hi]
            assert got["ended"] == list(range(hi - lo))
            ref = np.asarray(want["logprobs"][lo:hi])
            np.testing.assert_allclose(got["logprobs"], ref, rtol=0,
                                       atol=logprob_atol(ref, TINY.vocab_size))
    static = one["static"]
    for got in [one["free"]] + [
            {k: [r for p in two for r in p["free"][k]] for k in ("tokens", "mask", "logprobs")}]:
        assert got["tokens"] == static["tokens"] and got["mask"] == static["mask"]
        ref = np.asarray(static["logprobs"])
        np.testing.assert_allclose(got["logprobs"], ref, rtol=0,
                                   atol=logprob_atol(ref, TINY.vocab_size))
    # The constraint bites: at even steps only the lower half of the vocabulary, and every
    # row is complete (a forced stop) by its 5th token.
    tokens, mask = np.asarray(one["constrained"]["tokens"]), np.asarray(one["constrained"]["mask"])
    assert (tokens[:, ::2][mask[:, ::2]] < TINY.vocab_size // 2).all()
    assert max(one["constrained"]["lengths"]) <= 5
