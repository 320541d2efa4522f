"""LoRA trainees over one frozen base, and float32 master weights (issue Scale I).

- LoRA at initialisation gives the base model's logits exactly; the reference of a LoRA
  trainee is the base with no adapter.
- After a step moves the adapters, the merged export (W + alpha/r A B) gives the adapted
  model's logits.
- float32 masters with bfloat16 compute: at the paper's learning rate 1e-6 every entry of a
  matrix moves in one AdamW step, where bfloat16 params round most of the update away.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from drubric_jax import models, sampling
from drubric_jax.rl import train_config
from drubric_jax.rl import train_step as ts
from drubric_jax.models import config as cfg_lib
from drubric_jax.models import lora

CFG = cfg_lib.TINY_QWEN3.replace(lora_rank=4, lora_alpha=8.0)
TOKENS = np.array([[5, 17, 300, 4000, 9, 12, 77, 3]], np.int32)


def logits(params, cfg):
    mask = np.ones_like(TOKENS, bool)
    return np.asarray(models.apply(params, cfg, jnp.asarray(TOKENS),
                                   models.positions_from_mask(jnp.asarray(mask)))[0])


def test_lora_at_init_is_the_base_model_exactly():
    base = models.init_params(CFG, jax.random.PRNGKey(0))
    adapters = ts.trainable_init(CFG, jax.random.PRNGKey(1), base)
    a, b = lora.names("wq")
    assert adapters["layers"][a].shape == (CFG.num_layers, CFG.dim, 4)
    assert not np.any(np.asarray(adapters["layers"][b]))  # B = 0
    np.testing.assert_array_equal(logits(lora.attach(base, adapters), CFG), logits(base, CFG))
    assert set(adapters["layers"]) == {n for t in CFG.lora_targets for n in lora.names(t)}


def _batch(params, cfg):
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13], [14, 15, 16, 17, 18]]
    ro = sampling.generate(params, cfg, prompts, key=jax.random.PRNGKey(2), max_new_tokens=6,
                           method=sampling.Temperature(1.0), stop_ids=[3])
    return ts.batch_from_rollout(ro, np.array([1.0, -1.0, 0.5, -0.5], np.float32),
                                 np.ones(4, bool))


def _step(cfg, tc, state, batch, ref):
    opt = train_config.make_optimizer(tc)
    fn = jax.jit(functools.partial(ts.train_step, model_cfg=cfg, train_cfg=tc, optimizer=opt))
    return fn(state, batch, ref)


def test_lora_step_trains_adapters_only_and_merged_export_matches():
    base = models.init_params(CFG, jax.random.PRNGKey(0))
    adapters = ts.trainable_init(CFG, jax.random.PRNGKey(1), base)
    batch = _batch(base, CFG.replace(lora_rank=0))
    tc = train_config.TrainConfig(learning_rate=1e-2, micro_batch_size=4, beta=0.01)
    state = ts.init_train_state(adapters, train_config.make_optimizer(tc))
    new, metrics = _step(CFG, tc, state, batch, base)
    assert float(metrics["kl"]) == 0.0  # the first step starts at the reference (the base)
    assert set(new.params["layers"]) == set(adapters["layers"])  # only adapters trained
    moved = lora.attach(base, new.params)
    assert np.abs(logits(moved, CFG) - logits(base, CFG)).max() > 1e-4
    merged = lora.merge(base, new.params, CFG)
    assert set(merged["layers"]) == set(base["layers"])
    plain = CFG.replace(lora_rank=0)
    # One float32 matmul against two: a few ulps of the logits' scale.
    np.testing.assert_allclose(logits(merged, plain), logits(moved, CFG), atol=1e-5)


def test_float32_masters_move_every_entry_at_lr_1e6():
    cfg = cfg_lib.TINY.replace(dtype="bfloat16", param_dtype="bfloat16")
    base = models.init_params(cfg, jax.random.PRNGKey(0))  # the frozen bf16 base
    batch = _batch(base, cfg)
    tc = train_config.TrainConfig(learning_rate=1e-6, micro_batch_size=4, beta=0.0)
    masters = ts.trainable_init(cfg.replace(param_dtype="float32"), base=base)
    assert masters["layers"]["wq"].dtype == jnp.float32
    moved = {}
    for name, params, c in (("f32 masters", masters, cfg.replace(param_dtype="float32")),
                            ("bf16 params", base, cfg)):
        state = ts.init_train_state(params, train_config.make_optimizer(tc))
        new, _ = _step(c, tc, state, batch, base)
        before = np.asarray(params["layers"]["wq"], np.float32)
        after = np.asarray(new.params["layers"]["wq"], np.float32)
        moved[name] = float(np.mean(after != before))
    assert moved["f32 masters"] == 1.0, moved
    assert moved["bf16 params"] < 0.5, moved  # most of the 1e-6 step rounds away in bf16


def test_lora_rollouts_sample_from_the_adapted_policy(tmp_path):
    """The sampler runs a LoRA trainee with its adapters: after the adapters move, the
    rollout's log-probs are the train step's log-probs of the same tokens (on-policy,
    ratio 1 before the update), and they differ from the base model's. Before this test
    the sampler ran the source's config (LoRA scale 0) and drew from the base forever."""
    import dataclasses

    from helpers import tiny_config
    from tolerances import logprob_atol

    from drubric_jax.rl.logprobs import sequence_logprobs
    from drubric_jax.rounds import loop, phases
    from drubric_jax.rounds.context import Timer
    from drubric_jax.types import Role

    c = tiny_config(extra="")
    c.lora.rank, c.lora.alpha = 4, 8.0
    c.policy.max_new_tokens = 6
    run = loop.setup(c, str(tmp_path))
    try:
        trainee = run.ctx.roles.trainee(Role.POLICY)
        # Adapters as after some updates: B no longer 0.
        layers = dict(trainee.state.params["layers"])
        for i, name in enumerate(sorted(layers)):
            if name.endswith("_lora_b"):
                layers[name] = 0.05 * jax.random.normal(jax.random.PRNGKey(i),
                                                        layers[name].shape, layers[name].dtype)
        trainee.state = trainee.state.replace(params={**trainee.state.params, "layers": layers})
        assert any(np.any(np.asarray(v)) for k, v in layers.items()
                   if k in {lora.names(t)[1] for t in trainee.cfg.lora_targets})
        rollout, _ = phases.sample_responses(run.ctx, jax.random.PRNGKey(3),
                                             [run.data.prompts[0].prompt], [[]], 2, Timer())
        batch = ts.batch_from_rollout(rollout, np.zeros(rollout.num_rows, np.float32),
                                     np.ones(rollout.num_rows, bool))
        t = c.policy.temperature

        def logp(params, cfg):
            return np.asarray(sequence_logprobs(params, cfg, jnp.asarray(batch.tokens),
                                                jnp.asarray(batch.token_mask), t,
                                                start=batch.prompt_len))
        mask = np.asarray(batch.loss_mask)
        adapted = logp(trainee.params, trainee.cfg)
        base = logp(trainee.model.params, trainee.model.cfg)
        old = np.asarray(batch.old_logprobs)
        # The sampler's incremental decode against one full forward: the log-softmax
        # rounding that `tolerances.logprob_atol` bounds.
        np.testing.assert_allclose(old[mask], adapted[mask],
                                   atol=logprob_atol(old[mask], trainee.cfg.vocab_size))
        assert np.max(np.abs(old[mask] - base[mask])) > 1e-2
    finally:
        loop.close(run)
