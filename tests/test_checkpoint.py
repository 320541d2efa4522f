"""Tests of checkpoint resume: optimizer state, warm-up position, PRNG key, shardings.

case-21: 3 uninterrupted Adam steps must equal 2 steps + save/restore + 1 step, and the
resumed run must draw step 3's key, not replay an earlier one.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from drubric_jax import parallel
from drubric_jax.rl import train_config
from drubric_jax.rl import train_step as ts
from drubric_jax.rounds import loop
from drubric_jax.rounds.checkpoint import Checkpointer
from drubric_jax.models import config, init_params
from tolerances import close


def _apply(optimizer, state, grad):
    """One update of a TrainState holding a scalar or small pytree."""
    grads = jax.tree.map(lambda p: jnp.full_like(p, grad), state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    return ts.TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                         opt_state=opt_state)


def test_case_21_resume_optimizer_and_rng(load_case, tmp_path):
    grads = [1.0, 1.0, -1.0]
    want_each = [-0.099999, -0.199998, -0.226197]
    case = load_case("case-21")
    if case is not None:
        grads = case["input"]["grads_per_step"]
        want_each = case["expected"]["param_after_each_step_uninterrupted"]
        assert case["expected"]["param_after_step3_resumed"] == want_each[2]
        assert case["expected"]["adam_count_after_restore"] == 2
    optimizer = optax.adam(learning_rate=0.1, b1=0.9, b2=0.999, eps=1e-8)
    key0 = jax.random.PRNGKey(0)

    state = ts.init_train_state(jnp.float32(0.0), optimizer)
    straight = []
    for g in grads:
        state = _apply(optimizer, state, g)
        straight.append(float(state.params))
    close(straight, want_each, atol=1e-6)

    state = ts.init_train_state(jnp.float32(0.0), optimizer)
    for g in grads[:2]:
        state = _apply(optimizer, state, g)
    meta = {"round": 0, "phase": "policy", "step": int(state.step),
            "data_position": {"policy_prompts": 16}, "seed": 0}
    with Checkpointer(tmp_path / "ckpt", max_to_keep=2) as ckpt:
        assert ckpt.save(2, state, meta)

    # A new process: fresh manager, fresh (wrong-valued) target of the same structure.
    ckpt = Checkpointer(tmp_path / "ckpt")
    assert ckpt.latest() == 2
    target = ts.init_train_state(jnp.float32(123.0), optimizer)
    restored, meta2 = ckpt.restore(ckpt.latest(), target)
    ckpt.close()
    assert meta2 == meta
    assert int(restored.opt_state[0].count) == 2 and int(restored.step) == 2
    resumed = _apply(optimizer, restored, grads[2])
    close(float(resumed.params), want_each[2], atol=1e-6)
    assert abs(float(resumed.params) - (-0.099999)) > 0.05  # not a fresh Adam state

    # Key scheme (`loop.phase_key`): the key of a step is a function of (seed, round, phase,
    # steps done), all in the checkpoint; the resumed third step draws the uninterrupted
    # third step's key, never the seed key or the first step's again.
    key3 = loop.phase_key(meta2["seed"], meta2["round"], meta2["phase"], meta2["step"])
    straight_key3 = loop.phase_key(0, 0, "policy", 2)
    np.testing.assert_array_equal(key3, straight_key3)
    for other in (key0, loop.phase_key(0, 0, "policy", 0)):
        assert not np.array_equal(np.asarray(key3), np.asarray(other))


def test_resume_keeps_warmup_position(tmp_path):
    cfg = train_config.TrainConfig(learning_rate=0.5, warmup_steps=10, max_grad_norm=1e6,
                         weight_decay=0.1)
    optimizer = train_config.make_optimizer(cfg)
    params = {"w": jnp.zeros((3,), jnp.float32), "final_norm": jnp.ones((3,), jnp.float32)}
    state = ts.init_train_state(params, optimizer)
    for g in (1.0, 2.0):
        state = _apply(optimizer, state, g)
    with Checkpointer(tmp_path, max_to_keep=1) as ckpt:
        ckpt.save(int(state.step), state, {"step": int(state.step)})
        restored, _ = ckpt.restore(None, ts.init_train_state(params, optimizer))
    assert int(train_config.schedule_count(restored.opt_state)) == 2
    close(train_config.learning_rate_schedule(cfg)(train_config.schedule_count(restored.opt_state)),
          0.15, atol=1e-6)
    a, b = _apply(optimizer, state, -1.0), _apply(optimizer, restored, -1.0)
    jax.tree.map(lambda x, y: close(x, y, atol=0), a.params, b.params)
    fresh = _apply(optimizer, ts.TrainState(step=restored.step, params=restored.params,
                                            opt_state=optimizer.init(params)), -1.0)
    assert not np.allclose(fresh.params["w"], a.params["w"])  # warm-up restart would differ


def test_restore_onto_sharded_target(tmp_path):
    cfg = config.TINY.replace(vocab_size=256)
    optimizer = train_config.make_optimizer(train_config.TrainConfig())
    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    saved = ts.shard_train_state(
        ts.init_train_state(init_params(cfg, jax.random.PRNGKey(0)), optimizer), mesh)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(5, saved, {"step": 5})
        target = ts.shard_train_state(
            ts.init_train_state(init_params(cfg, jax.random.PRNGKey(1)), optimizer), mesh)
        restored, _ = ckpt.restore(5, target)
        plain, _ = ckpt.restore(5, jax.eval_shape(lambda: target))  # no shardings: device 0
    for got, want, tgt in zip(jax.tree.leaves(restored), jax.tree.leaves(saved),
                              jax.tree.leaves(target)):
        close(got, want, atol=0)
        assert got.sharding == tgt.sharding
    assert restored.params["layers"]["w_up"].sharding.spec == P(None, "fsdp", "tensor")
    close(plain.params["embed"], saved.params["embed"], atol=0)
    assert len(plain.params["embed"].sharding.device_set) == 1


def test_params_only_restore_skips_placeholder_leaves(tmp_path):
    """Placeholder leaves (the AdamW moments) are not read: the params come back sharded
    as the target asks, the placeholders stay placeholders (experiments/coevolution.py)."""
    import orbax.checkpoint as ocp

    cfg = config.TINY.replace(vocab_size=256)
    optimizer = train_config.make_optimizer(train_config.TrainConfig())
    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    saved = ts.shard_train_state(
        ts.init_train_state(init_params(cfg, jax.random.PRNGKey(0)), optimizer), mesh)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(3, {"policy": saved}, {"step": 3})
        target = {"policy": saved.replace(opt_state=jax.tree.map(lambda _: ocp.PLACEHOLDER,
                                                                  saved.opt_state))}
        got, _ = ckpt.restore(3, target)
    for a, b in zip(jax.tree.leaves(got["policy"].params), jax.tree.leaves(saved.params)):
        close(a, b, atol=0)
        assert a.sharding == b.sharding
    assert all(x is ocp.PLACEHOLDER for x in jax.tree.leaves(got["policy"].opt_state))


def test_latest_interval_and_max_to_keep(tmp_path):
    with Checkpointer(tmp_path, max_to_keep=2, save_interval=2) as ckpt:
        assert ckpt.latest() is None
        with pytest.raises(FileNotFoundError):
            ckpt.restore(None, {"x": jnp.zeros(2)})
        assert not ckpt.save(1, {"x": jnp.ones(2)}, {"step": 1})
        for s in (2, 4, 6):
            x = jnp.full((2,), float(s))
            assert ckpt.save(s, {"x": x}, {"step": s})
            x.delete()  # as a donating train step would: save already copied it to host
        assert ckpt.all_steps() == [4, 6] and ckpt.latest() == 6
        x, meta = ckpt.restore(4, {"x": jnp.zeros(2)})
        close(x["x"], [4.0, 4.0], atol=1e-6)
        assert meta == {"step": 4}
        with pytest.raises(TypeError, match="meta"):
            ckpt.save(8, {"x": jnp.ones(2)}, [1, 2])
    with pytest.raises(ValueError, match="save_interval"):
        Checkpointer(tmp_path, save_interval=0)


def test_checkpoint_directory_keeps_urls_and_makes_local_paths_absolute(tmp_path,
                                                                          monkeypatch):
    """A gs:// workdir stays a URL (abspath once made it "<cwd>/gs:/bucket/run"); a
    relative local path becomes absolute."""
    from drubric_jax.rounds.checkpoint import resolve_directory

    monkeypatch.chdir(tmp_path)
    assert str(resolve_directory("gs://bucket/run/checkpoints")) == "gs://bucket/run/checkpoints"
    assert str(resolve_directory("run/checkpoints")) == str(tmp_path / "run" / "checkpoints")


def test_put_and_fetch_round_trip_on_a_mesh():
    """`parallel.put` of a host batch onto rows over (data, fsdp) and `parallel.fetch`
    back give the same values (one process; tests/test_multihost.py runs two)."""
    mesh = parallel.make_mesh(2, 2, 2, jax.devices()[:8])
    x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    tree = parallel.put_rows({"a": x, "b": x[:, 0] > 3}, mesh)
    assert tree["a"].sharding.spec == P(parallel.BATCH_AXES)
    back = parallel.fetch(tree)
    np.testing.assert_array_equal(back["a"], x)
    np.testing.assert_array_equal(back["b"], x[:, 0] > 3)


def test_restore_reads_the_trainees_of_an_old_two_role_checkpoint(tmp_path):
    """A checkpoint written when both roles were saved restores into a run that trains the
    policy only: `partial=True` reads the policy's leaves and leaves the generator's."""
    optimizer = train_config.make_optimizer(train_config.TrainConfig())
    policy = ts.init_train_state({"w": jnp.arange(3, dtype=jnp.float32)}, optimizer)
    generator = ts.init_train_state({"v": jnp.ones((2, 2), jnp.float32)}, optimizer)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(4, {"policy": policy, "generator": generator}, {"step": 4})
        assert set(ckpt.saved_tree(4)) == {"policy", "generator"}
        target = {"policy": ts.init_train_state({"w": jnp.zeros(3, jnp.float32)}, optimizer)}
        got, meta = ckpt.restore(4, target, partial=True)
    assert set(got) == {"policy"} and meta == {"step": 4}
    close(got["policy"].params["w"], [0.0, 1.0, 2.0], atol=0)


@pytest.mark.slow  # 10-21 s on 2 cores (make test-fast leaves it out)
@pytest.mark.usefixtures("smollm2_gguf")
def test_checkpoint_holds_trainees_only(tmp_path):
    """A rule-reward policy run whose generator never trains (rounds.generator_steps = 0,
    no held-out evaluation: the gold arm of configs/checks_policy.py) with LoRA trainees:
    the generator is not loaded, the checkpoints hold the policy only, and of it the
    adapters and their AdamW moments (no base weight); the run resumes from them and ends
    with the policy's export only."""
    import os

    from drubric_jax.models import lora
    from helpers import tiny_config

    c = tiny_config()
    c.policy.reward = "word_limit"
    c.policy.reward_max_words = 1  # the random model's 8-token answers differ in word count
    c.rounds.generator_steps = 0
    c.rounds.heldout_eval = False
    c.lora.rank = 2
    c.export = True
    workdir = str(tmp_path / "run")
    loop.run(c, workdir, stop_after_rounds=1)

    with Checkpointer(os.path.join(workdir, "checkpoints")) as ckpt:
        step = ckpt.latest()
        assert step == 1
        assert ckpt.read_meta(step)["trainees"] == ["policy"]
        saved = ckpt.saved_tree(step)
    assert set(saved) == {"policy"}
    adapters = {name for t in c.lora.targets for name in lora.names(t)}
    params = saved["policy"]["params"]
    assert set(params) == {"layers"} and set(params["layers"]) == adapters
    # The AdamW moments mirror the adapters; beside them only scalar counters.
    shapes = {tuple(x.shape) for x in jax.tree.leaves(params)}
    moments = [x for x in jax.tree.leaves(saved["policy"]["opt_state"]) if len(x.shape)]
    assert moments and {tuple(x.shape) for x in moments} == shapes
    assert len(moments) == 2 * len(adapters)  # mu and nu of each adapter leaf

    run = loop.setup(c, workdir)
    try:
        roles = run.ctx.roles
        assert roles.generator is None and run.ctx.generator is None  # never loaded
        assert [t.role.value for t in roles.trainees()] == ["policy"]
        assert loop.restore(run) and run.loop.global_step == 1 and run.loop.round == 1
        restored = jax.device_get(roles.policy.state.params)
        assert int(roles.policy.state.step) == 1
        # B starts at 0 (`lora.init_adapters`): a non-zero B is the trained adapter.
        assert any(np.any(v != 0) for k, v in restored["layers"].items() if k.endswith("_b"))
    finally:
        loop.close(run)

    loop.run(c, workdir)  # resumes at round 1 and finishes
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    train = [r for r in rows if r["kind"] == "train"]
    assert [(r["round"], r["phase"]) for r in train] == [(0, "policy"), (1, "policy")]
    for r in train:
        assert r["seconds_checkpoint"] > 0 and r["redraws"] >= 0
        assert r["update_skipped"] in (0.0, 1.0)
    assert "seconds_park" in train[0]
    # This seed's first step redrew once and then trained (so the adapters below moved).
    assert train[0]["update_skipped"] == 0.0 and train[0]["redraws"] == 1
    assert os.listdir(os.path.join(workdir, "export")) == ["policy"]
    with Checkpointer(os.path.join(workdir, "checkpoints")) as ckpt:
        assert ckpt.latest() == 2 and set(ckpt.saved_tree(2)) == {"policy"}
        got, _ = ckpt.restore(1, {"policy": jax.eval_shape(lambda: roles.policy.state)})
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(got["policy"].params), restored)
