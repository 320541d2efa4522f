"""The verifier's pass schedule (drubric_jax/evaluator/schedule.py): one process's schedule
(longest rows first, budget caps, row shards) and several processes' (every row once,
an even share of each pass per process, the bucket of the longest row)."""
import pytest

from drubric_jax.sampling import bucket_length
from drubric_jax.evaluator.schedule import Pass, plan_passes


def _bucket(n):
    return bucket_length(n, 16)


def test_one_process_sorts_longest_first_and_caps_rows_by_the_budget():
    lengths = [[20, 100, 17, 300, 100, 5]]
    # At most 512 tokens of rows per pass (a prefill budget): 1 row at 512, 4 at 128 ...
    got = plan_passes(lengths, bucket_of=_bucket, max_rows_of=lambda b: max(512 // b, 1),
                      row_shards=1)
    assert got == [Pass(512, 1, ((3,),)), Pass(128, 4, ((1, 4, 0, 2),)),
                   Pass(16, 1, ((5,),))]


def test_rows_round_up_to_the_row_shards_and_to_a_power_of_two_of_what_is_left():
    got = plan_passes([[30, 30, 30]], bucket_of=_bucket, max_rows_of=lambda b: 64,
                      row_shards=8)
    # 3 rows left -> a pass of 4, rounded up to the 8 row shards (5 filler rows).
    assert got == [Pass(32, 8, ((0, 1, 2),))]


def test_several_processes_share_every_pass_evenly():
    lengths = [[40, 10, 300, 12, 11], [200], []]
    got = plan_passes(lengths, bucket_of=_bucket, max_rows_of=lambda b: 3 if b > 64 else 6,
                      row_shards=3)
    # Pass 1: the longest row of each process, bucket of the longest (300 -> 512).
    assert got[0] == Pass(512, 3, ((2,), (0,), ()))
    assert got[1] == Pass(64, 6, ((0, 3), (), ()))
    assert got[2] == Pass(16, 6, ((4, 1), (), ()))
    for q, n in enumerate(map(len, lengths)):
        seen = [i for ps in got for i in ps.members[q]]
        assert sorted(seen) == list(range(n))          # every row exactly once
    for ps in got:
        assert ps.rows % 3 == 0
        assert all(len(m) <= ps.rows // 3 for m in ps.members)
        assert ps.bucket == max(_bucket(lengths[q][i]) for q, m in enumerate(ps.members)
                                for i in m)


def test_no_rows_give_no_pass_and_a_bad_row_shard_count_is_refused():
    assert plan_passes([[], []], bucket_of=_bucket, max_rows_of=lambda b: 4,
                       row_shards=2) == []
    with pytest.raises(ValueError, match="multiple of the process count"):
        plan_passes([[1], [2]], bucket_of=_bucket, max_rows_of=lambda b: 4, row_shards=3)
