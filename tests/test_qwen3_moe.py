"""The Qwen3 mixture-of-experts family (`models.qwen3_moe`): routing and grouped experts by
hand, loading a Hugging Face directory, and parity with transformers' Qwen3MoeForCausalLM
on a tiny random checkpoint (torch, from the test extra in setup.py, is the reference:
without it those tests fail, they do not skip).

Tolerance of the parity checks: 1e-4 on float32 logits of size ~1 (the issue's bound): two
float32 implementations of the same 2-layer network sum in different orders (XLA vs
torch's kernels), which moves logits by ~1e-6; a wrong routing, RoPE or norm moves them
by >= 1e-2.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from drubric_jax import models, parallel
from drubric_jax.models import qwen3_moe, registry
from drubric_jax.models.config import PRESETS, ModelConfig
from drubric_jax.models.export import export_hf_dir
from drubric_jax.models.weights import config_from_hf, load_hf_dir

CFG = PRESETS["tiny_qwen3_moe"]


def _naive_moe(cfg, p, h, capacity=None):
    """The mixture of experts as transformers' loop over experts writes it, in numpy; with
    `capacity`, an expert takes the first `capacity` of its (token, expert) pairs in
    (token, top-k slot) order and drops the rest. Returns (output, pairs dropped)."""
    x = np.asarray(h, np.float64).reshape(-1, cfg.dim)
    taken, dropped = np.zeros(cfg.num_experts, int), 0
    logits = x @ np.asarray(p["router"], np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for n in range(x.shape[0]):
        top = np.argsort(-probs[n], kind="stable")[:cfg.num_experts_per_tok]
        w = probs[n, top] / (probs[n, top].sum() if cfg.norm_topk_prob else 1.0)
        for e, we in zip(top, w):
            taken[e] += 1
            if capacity is not None and taken[e] > capacity:
                dropped += 1
                continue
            g = x[n] @ np.asarray(p["we_gate"][e], np.float64)
            u = x[n] @ np.asarray(p["we_up"][e], np.float64)
            out[n] += we * ((g / (1 + np.exp(-g))) * u) @ np.asarray(p["we_down"][e], np.float64)
    return out.reshape(np.shape(h)), dropped


@pytest.mark.parametrize("dispatch", ["capacity", "ragged"])
@pytest.mark.parametrize("norm_topk", [True, False])
def test_moe_mlp_equals_the_loop_over_experts(norm_topk, dispatch):
    """Both dispatches; at this size (15 tokens, k = 2, E = 4) the default capacity factor
    2 gives C = min(15, ceil(2 * 30 / 4)) = 15 rows per expert: nothing is dropped."""
    cfg = CFG.replace(norm_topk_prob=norm_topk, moe_dispatch=dispatch)
    params = registry.init_params(cfg, jax.random.PRNGKey(0))
    p = {k: v[0] for k, v in params["layers"].items()}
    # Larger router weights than init's: tokens then differ clearly in their top-k experts.
    p["router"] = p["router"] * 50
    h = jax.random.normal(jax.random.PRNGKey(1), (3, 5, cfg.dim), jnp.float32)
    got = jax.jit(lambda p, h: qwen3_moe.moe_mlp(cfg, p, h))(p, h)
    want, dropped = _naive_moe(cfg, p, h)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-4)
    assert dropped == 0 and int(qwen3_moe.dropped_pairs(cfg, p["router"], h)) == 0
    weights, experts = qwen3_moe.route(cfg, p["router"], h.reshape(-1, cfg.dim))
    assert experts.shape == (15, 2) and len(np.unique(np.asarray(experts))) > 2
    if norm_topk:
        np.testing.assert_allclose(np.asarray(weights.sum(-1)), 1.0, rtol=1e-6)


def test_capacity_dispatch_drops_the_pairs_past_capacity_and_counts_them():
    """Capacity factor 0.5: C = ceil(0.5 * 30 / 4) = 4 rows per expert for 30 (token,
    expert) pairs, so some pairs are dropped; the output equals the loop that skips the
    same pairs (the first C of each expert in token order are kept), and `dropped_pairs`
    counts them. Factor 0 (C = N) drops nothing."""
    cfg = CFG.replace(moe_capacity_factor=0.5)
    params = registry.init_params(cfg, jax.random.PRNGKey(0))
    p = {k: v[0] for k, v in params["layers"].items()}
    p["router"] = p["router"] * 50
    h = jax.random.normal(jax.random.PRNGKey(1), (3, 5, cfg.dim), jnp.float32)
    assert qwen3_moe.capacity(cfg, 15) == 4
    want, dropped = _naive_moe(cfg, p, h, capacity=4)
    assert dropped > 0
    got = jax.jit(lambda p, h: qwen3_moe.moe_mlp(cfg, p, h))(p, h)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-4)
    assert int(qwen3_moe.dropped_pairs(cfg, p["router"], h)) == dropped
    free = cfg.replace(moe_capacity_factor=0.0)
    assert qwen3_moe.capacity(free, 15) == 15
    assert int(qwen3_moe.dropped_pairs(free, p["router"], h)) == 0
    with pytest.raises(ValueError, match="moe_dispatch must be one of"):
        cfg.replace(moe_dispatch="dense")


def test_capacity_dispatch_runs_per_row_shard_under_a_mesh():
    """Under `parallel.rows_on(mesh)` with 4 row shards (fsdp = 4 of the fake devices), the
    8 rows of a call are dispatched in 4 groups of 2 rows, each with its own capacity
    (GShard's groups): the output equals the 1-device loop over experts run on each
    group's rows alone, and the dropped pairs and router load are the groups' sums. At
    factor 0.5 a group of 2 x 5 tokens has C = ceil(0.5 * 20 / 4) = 3 rows per expert,
    so pairs are dropped (the check is not vacuous)."""
    cfg = CFG.replace(moe_capacity_factor=0.5)
    params = registry.init_params(cfg, jax.random.PRNGKey(0))
    p = {k: v[0] for k, v in params["layers"].items()}
    p["router"] = p["router"] * 50
    h = jax.random.normal(jax.random.PRNGKey(1), (8, 5, cfg.dim), jnp.float32)
    mask = jnp.ones((8, 5), bool).at[1, 3:].set(False)
    mesh = parallel.make_mesh(1, 4, 1, jax.devices()[:4])
    with parallel.rows_on(mesh):
        assert qwen3_moe.dispatch_groups(cfg, 8) == 4
        assert qwen3_moe.dispatch_groups(cfg, 6) == 1  # rows the shards do not divide
        assert qwen3_moe.dispatch_groups(cfg.replace(moe_dispatch="ragged"), 8) == 1
        got = jax.jit(lambda p, h: qwen3_moe.moe_mlp(cfg, p, h))(p, h)
        dropped = int(jax.jit(lambda r, h: qwen3_moe.dropped_pairs(cfg, r, h))(p["router"], h))
        load = jax.jit(lambda r, h, m: qwen3_moe.router_load(cfg, r, h, m))(
            p["router"], h, mask)
    assert qwen3_moe.dispatch_groups(cfg, 8) == 1  # no mesh context: one group
    want, drops, loads = [], 0, []
    for g in range(4):
        rows = slice(2 * g, 2 * g + 2)
        out, d = _naive_moe(cfg, p, h[rows], capacity=qwen3_moe.capacity(cfg, 10))
        want.append(out)
        drops += d
        loads.append(qwen3_moe.router_load(cfg, p["router"], h[rows], mask[rows]))
    assert qwen3_moe.capacity(cfg, 10) == 3 and drops > 0
    np.testing.assert_allclose(np.asarray(got), np.concatenate(want), atol=1e-5, rtol=1e-4)
    assert dropped == drops
    for key in ("pairs", "dropped", "routed"):
        np.testing.assert_array_equal(np.asarray(load[key]),
                                      np.sum([np.asarray(x[key]) for x in loads], axis=0))


@pytest.mark.slow
def test_cache_decode_equals_full_forward():
    params = registry.init_params(CFG, jax.random.PRNGKey(2))
    tokens = jax.random.randint(jax.random.PRNGKey(3), (2, 9), 0, CFG.vocab_size)
    pos = jnp.broadcast_to(jnp.arange(9), (2, 9))
    full, _ = registry.apply(params, CFG, tokens, pos)
    cache = registry.init_cache(CFG, 2, 16)
    _, cache = registry.apply(params, CFG, tokens[:, :6], pos[:, :6], cache)
    steps = []
    for t in range(6, 9):
        logits, cache = registry.apply(params, CFG, tokens[:, t:t + 1], pos[:, t:t + 1], cache)
        steps.append(logits[:, 0])
    np.testing.assert_allclose(np.stack(steps, 1), full[:, 6:], atol=1e-5)


def test_30b_a3b_preset_size_and_hf_config_rules():
    shapes = jax.eval_shape(lambda k: registry.init_params(PRESETS["qwen3_30b_a3b"], k),
                            jax.random.PRNGKey(0))
    gb = sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(shapes)) / 1e9
    assert 60.5 < gb < 61.5, gb  # 30.5B bfloat16 parameters
    hf = {"model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 16,
          "intermediate_size": 32, "moe_intermediate_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
          "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True}
    cfg = config_from_hf(hf)
    assert (cfg.family, cfg.hidden_dim, cfg.num_experts, cfg.qk_norm) == ("qwen3_moe", 8, 4,
                                                                           True)
    # transformers 5 writes num_local_experts instead of num_experts.
    alt = {k: v for k, v in hf.items() if k != "num_experts"}
    assert config_from_hf({**alt, "num_local_experts": 4}).num_experts == 4
    with pytest.raises(ValueError, match="num_experts"):
        config_from_hf(alt)
    with pytest.raises(ValueError, match="mlp_only_layers"):
        config_from_hf({**hf, "mlp_only_layers": [0]})
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        ModelConfig(**{**CFG.__dict__, "num_experts_per_tok": 5})
    with pytest.raises(NotImplementedError, match="qwen3_moe"):
        export_hf_dir({}, CFG, "/nonexistent")


# ----------------------------------------------------------------------------- transformers


@pytest.fixture(scope="module")
def hf_moe(tmp_path_factory):
    """A tiny random Qwen3MoeForCausalLM written by transformers (per-expert tensors, as the
    Qwen checkpoints store them) and the torch model itself."""
    import torch  # the test extra (setup.py): its absence is a broken environment
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    hf_cfg = Qwen3MoeConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], max_position_embeddings=256, rope_theta=10000.0)
    model = Qwen3MoeForCausalLM(hf_cfg).eval()
    with torch.no_grad():  # routers at init are near-uniform: spread them so top-k matters
        for layer in model.model.layers:
            layer.mlp.gate.weight.mul_(30.0)
    path = tmp_path_factory.mktemp("qwen3_moe")
    model.save_pretrained(path)
    return torch, model, str(path)


def _torch_logits(torch, model, tokens):
    with torch.no_grad():
        return model(torch.tensor(np.asarray(tokens))).logits.float().numpy()


def test_hf_directory_loads_with_per_expert_tensors(hf_moe):
    _, _, path = hf_moe
    names = json.load(open(f"{path}/config.json"))
    assert names["model_type"] == "qwen3_moe"
    cfg, params = load_hf_dir(path)
    assert cfg.family == "qwen3_moe" and cfg.num_experts == 4 and cfg.hidden_dim == 16
    assert params["layers"]["we_gate"].shape == (2, 4, 32, 16)
    assert params["layers"]["we_down"].shape == (2, 4, 16, 32)
    assert params["layers"]["router"].shape == (2, 32, 4)


@pytest.mark.slow
def test_logits_equal_transformers_with_and_without_cache(hf_moe):
    torch, model, path = hf_moe
    cfg, params = load_hf_dir(path)
    tokens = jax.random.randint(jax.random.PRNGKey(4), (2, 11), 0, cfg.vocab_size)
    want = _torch_logits(torch, model, tokens)
    pos = jnp.broadcast_to(jnp.arange(11), (2, 11))
    full, _ = registry.apply(params, cfg, tokens, pos)
    np.testing.assert_allclose(np.asarray(full), want, atol=1e-4)
    cache = registry.init_cache(cfg, 2, 16)
    _, cache = registry.apply(params, cfg, tokens[:, :7], pos[:, :7], cache)
    for t in range(7, 11):
        logits, cache = registry.apply(params, cfg, tokens[:, t:t + 1], pos[:, t:t + 1], cache)
        np.testing.assert_allclose(np.asarray(logits[:, 0]), want[:, t], atol=1e-4)


def test_logits_equal_transformers_with_experts_split_two_ways(hf_moe):
    """The expert axis over fsdp = 2 (two of the fake CPU devices): each device holds 2 of
    the 4 experts of every layer; the logits are the same."""
    torch, model, path = hf_moe
    assert jax.device_count() >= 2, "tests/conftest.py sets 8 fake CPU devices"
    mesh = parallel.make_mesh(1, 2, 1, jax.devices()[:2])
    cfg, params = load_hf_dir(path, shardings=models.leaf_sharder(mesh))
    spec = params["layers"]["we_gate"].sharding.spec
    assert spec[1] == "fsdp", spec  # [L, E, D, F]: experts split
    tokens = jax.random.randint(jax.random.PRNGKey(5), (2, 9), 0, cfg.vocab_size)
    pos = jnp.broadcast_to(jnp.arange(9), (2, 9))
    logits, _ = jax.jit(lambda p, t, q: registry.apply(p, cfg, t, q))(params, tokens, pos)
    np.testing.assert_allclose(np.asarray(logits), _torch_logits(torch, model, tokens),
                               atol=1e-4)
