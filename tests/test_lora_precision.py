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
    return ts.batch_from_rollout(ro, np.array([1.0, -1.0, 0.5, -0.5], np.float32))


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
