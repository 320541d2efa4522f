"""Tests for drubric_jax.data.iterators: deterministic shuffling, host sharding and
resumable batching."""

import json

import numpy as np
import pytest

from drubric_jax.data import EpochIterator, host_shard, shuffled_order


def test_shuffled_order_deterministic_and_per_epoch():
    a = shuffled_order(50, seed=3, epoch=0)
    np.testing.assert_array_equal(a, shuffled_order(50, seed=3, epoch=0))
    assert sorted(a.tolist()) == list(range(50))
    assert not np.array_equal(a, shuffled_order(50, seed=3, epoch=1))
    assert not np.array_equal(shuffled_order(50, 1, 0), shuffled_order(50, 0, 1))
    with pytest.raises(ValueError):
        shuffled_order(5, -1)


@pytest.mark.parametrize("n,hosts", [(23, 4), (24, 4), (7, 1), (10, 3)])
def test_host_sharding_partitions_rows(n, hosts):
    for epoch in range(3):
        shards = [host_shard(n, 11, epoch, h, hosts) for h in range(hosts)]
        assert all(len(s) == n // hosts for s in shards)
        flat = np.concatenate(shards)
        assert len(set(flat.tolist())) == len(flat)  # disjoint
        order = shuffled_order(n, 11, epoch)
        assert set(flat.tolist()) == set(order[: n - n % hosts].tolist())
        for h in range(hosts):
            np.testing.assert_array_equal(shards[h], order[: n - n % hosts][h::hosts])
    with pytest.raises(ValueError):
        host_shard(10, 0, 0, host_id=2, num_hosts=2)


def test_epoch_iterator_covers_shard_and_reshuffles():
    items = list(range(20))
    it = EpochIterator(items, batch_size=3, seed=5, host_id=1, num_hosts=2, num_epochs=2)
    assert it.steps_per_epoch == 3
    batches = list(it)
    assert len(batches) == 6 and all(len(b) == 3 for b in batches)
    e0 = sum(batches[:3], [])
    e1 = sum(batches[3:], [])
    assert e0 == host_shard(20, 5, 0, 1, 2)[:9].tolist()
    assert e1 == host_shard(20, 5, 1, 1, 2)[:9].tolist()
    other = sum(list(EpochIterator(items, 3, 5, host_id=0, num_hosts=2, num_epochs=1)), [])
    assert not set(other) & set(e0)


def test_epoch_iterator_state_restore_reproduces_batches():
    items = [f"row{i}" for i in range(17)]
    it = EpochIterator(items, batch_size=4, seed=9)
    for _ in range(5):  # crosses the epoch boundary (4 steps per epoch)
        next(it)
    state = it.state()
    assert state["epoch"] == 1 and state["position"] == 1 and state["seed"] == 9
    state = json.loads(json.dumps(state))  # checkpoint round trip
    expected = [next(it) for _ in range(7)]
    fresh = EpochIterator(items, batch_size=4, seed=9)
    fresh.restore(state)
    assert [next(fresh) for _ in range(7)] == expected
    # state taken at the end of an epoch also resumes exactly
    it2 = EpochIterator(items, batch_size=4, seed=9)
    for _ in range(4):
        next(it2)
    s2 = it2.state()
    nxt = next(it2)
    it3 = EpochIterator(items, batch_size=4, seed=9)
    it3.restore(s2)
    assert next(it3) == nxt


def test_epoch_iterator_errors():
    with pytest.raises(ValueError):
        EpochIterator(list(range(3)), batch_size=4, seed=0)
    with pytest.raises(ValueError):
        EpochIterator(list(range(8)), batch_size=2, seed=0, host_id=2, num_hosts=2)
    it = EpochIterator(list(range(8)), batch_size=2, seed=0)
    with pytest.raises(ValueError):
        it.restore(dict(it.state(), batch_size=4))
    with pytest.raises(ValueError):
        it.restore(dict(it.state(), position=99))


def test_epoch_iterator_error_names_its_data():
    with pytest.raises(ValueError, match=r"^prompts: 3 rows over 1 hosts cannot fill one batch "
                                         r"of 4$"):
        EpochIterator(list(range(3)), batch_size=4, seed=0, name="prompts")
