"""The recipes of docs/CONVENTIONS.md, each followed with a toy addition made through the
registry the recipe names (a row added with `monkeypatch`, so it is gone after the test)
and used end to end at the smallest scale:

- add a KL estimator: a row of `rl.grpo.KL_ESTIMATORS`, used by `grpo_loss`;
- add a model family alias: a row of `models.registry.ALIASES`, whose config.json loads,
  initialises and runs a tiny model, and exports and loads back bit for bit; the same for
  a toy family module (the `llama` one renamed) in `models.registry.FAMILIES`;
- add a rule reward: a row of `rl.rule_rewards.RULES`, accepted by `config_check.validate`
  and scoring a response through the run's settings (`rounds.settings.read`).
"""
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import smollm2_cpu
from drubric_jax import config_check, models
from drubric_jax.models import llama, registry, weights
from drubric_jax.models.config import TINY_QWEN3
from drubric_jax.models.export import hf_config_dict
from drubric_jax.rl import grpo, rule_rewards
from drubric_jax.rounds import settings
from drubric_jax.types import ConfigError
from tolerances import close


def _abs_kl(logp, ref_logp):
    """Toy estimator |d| (d the clamped log-ratio, as the recipe says to take it)."""
    return jnp.abs(grpo._log_ratio_to_ref(logp, ref_logp))


def test_recipe_kl_estimator(monkeypatch):
    """A row "k_abs" in KL_ESTIMATORS is what `grpo_loss(kl_estimator="k_abs")` runs: with
    A = 0 the loss is beta * mean_t |ref - logp| (one row, seq_mean_token_mean), and its
    gradient beta * sign(logp - ref) / T, under jit as the train step calls it."""
    lp = np.array([[-1.0, -0.5, -3.0, -2.0]], np.float32)
    lr = np.array([[-2.0, -0.25, -3.5, -1.0]], np.float32)
    mask = np.ones_like(lp, bool)
    beta = 0.5
    with pytest.raises(ValueError, match="kl_estimator"):
        grpo.grpo_loss(lp, lp, lr, np.zeros(1), mask, beta=beta, kl_estimator="k_abs")
    monkeypatch.setitem(grpo.KL_ESTIMATORS, "k_abs", _abs_kl)

    @jax.jit
    def loss_and_grad(logp):
        return jax.value_and_grad(lambda x: grpo.grpo_loss(
            x, lp, lr, np.zeros(1), mask, beta=beta, kl_estimator="k_abs")[0])(logp)

    loss, grad = loss_and_grad(jnp.asarray(lp))
    d = lr - lp
    # float32 sums of 4 terms of size <= 1: a few ulps.
    close(loss, beta * np.abs(d).mean(), 1e-6)
    close(grad, beta * np.sign(-d) / lp.shape[1], 1e-6)


# The toy alias: a dense Qwen3 whose output head is always tied (fields the alias fixes).
TOY_TYPE = "toy_tied_qwen3"
TOY_ALIAS = registry.Alias("llama", "ToyTiedQwen3ForCausalLM",
                           {"qk_norm": True, "tie_embeddings": True})
TOY_HF = {"model_type": TOY_TYPE, "vocab_size": 64, "hidden_size": 16,
          "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
          "num_key_value_heads": 1, "head_dim": 8, "tie_word_embeddings": False}


def _load_run_export_load(hf: dict, directory) -> tuple:
    """config.json `hf` -> ModelConfig -> tiny random model -> logits -> export to
    `directory` -> load back; asserts the logits are finite and the reload is bit for bit.
    Returns (cfg, params, the written config.json)."""
    cfg = weights.config_from_hf(hf)
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    tokens = jnp.array([[1, 5, 9, 3]], jnp.int32)
    logits, _ = models.apply(params, cfg, tokens, jnp.arange(4)[None])
    assert logits.shape == (1, 4, cfg.vocab_size) and bool(jnp.all(jnp.isfinite(logits)))
    models.export_hf_dir(params, cfg, str(directory))
    with open(directory / "config.json") as f:
        written = json.load(f)
    cfg2, params2 = models.load_hf_dir(str(directory))
    assert cfg2 == cfg
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 params, params2)
    return cfg, params, written


def test_recipe_family_alias(monkeypatch, tmp_path):
    """A row in ALIASES: its config.json gives the family's config with the alias's fields
    fixed (over config.json's own), the tiny model initialises and runs, and its export
    writes the alias's model type and loads back equal, params bit for bit."""
    with pytest.raises(ValueError, match="model_type"):
        weights.config_from_hf(TOY_HF)
    monkeypatch.setitem(registry.ALIASES, TOY_TYPE, TOY_ALIAS)
    cfg, params, written = _load_run_export_load(TOY_HF, tmp_path)
    assert (cfg.family, cfg.qk_norm, cfg.tie_embeddings, cfg.dim) == ("llama", True, True, 16)
    assert "q_norm" in params["layers"] and "lm_head" not in params
    assert (written["model_type"], written["architectures"]) == (
        TOY_TYPE, [TOY_ALIAS.architecture])
    # A config the alias's fields do not match keeps its own model type.
    assert hf_config_dict(TINY_QWEN3, 1, 2)["model_type"] == "qwen3"


def test_recipe_model_family(monkeypatch, tmp_path):
    """A family module in FAMILIES (here the `llama` module under another NAME and model
    type): loading, the forward pass and export reach it through the registry alone."""
    toy = types.SimpleNamespace(**{k: v for k, v in vars(llama).items()
                                   if not k.startswith("__")})
    toy.NAME, toy.HF_MODEL_TYPE, toy.HF_ARCHITECTURE = "toy", "toy", "ToyForCausalLM"
    monkeypatch.setitem(registry.FAMILIES, toy.NAME, toy)
    cfg, _, written = _load_run_export_load({**TOY_HF, "model_type": "toy"}, tmp_path)
    assert (cfg.family, cfg.qk_norm, cfg.tie_embeddings) == ("toy", False, False)
    assert (written["model_type"], written["architectures"]) == ("toy", ["ToyForCausalLM"])
    assert registry.lora_targets() == llama.LORA_TARGETS  # the toy adds no new target


def _yes_fraction(item, response: str) -> float:
    """Toy rule: the fraction of the response's words that are "yes" (0 when empty)."""
    del item
    words = response.split()
    return sum(w == "yes" for w in words) / len(words) if words else 0.0


def test_recipe_rule_reward(monkeypatch):
    """A row in RULES: `--config.policy.reward=<name>` passes the config check and
    the run's settings (`rounds.settings.read`, the config read once) hold the rule,
    which scores a response."""
    config = smollm2_cpu.get_config("")
    config.policy.reward = "yes_fraction"
    with pytest.raises(ConfigError, match="config.policy.reward"):
        config_check.validate(config, device_count=1, process_count=1)
    monkeypatch.setitem(rule_rewards.RULES, "yes_fraction", lambda options: _yes_fraction)
    config_check.validate(config, device_count=1, process_count=1)
    rule = settings.read(config).rule
    assert rule(None, "yes no yes yes") == 0.75
    assert rule(None, "") == 0.0
