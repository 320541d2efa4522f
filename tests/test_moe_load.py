"""Router load metrics of the mixture-of-experts verifier (`qwen3_moe.router_load`,
`router_load_counts`, `load_summary`; `step_metrics.verifier_moe_metrics`), checked by hand
on the tiny MoE config (E = 4 experts, k = 2) with routers whose choices the test sets.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from drubric_jax import models
from drubric_jax.evaluator.verifier import Verifier
from drubric_jax.models import llama, qwen3_moe, registry
from drubric_jax.models.config import PRESETS
from drubric_jax.rounds import loop, phases
from drubric_jax.rounds.step_metrics import verifier_moe_metrics

CFG = PRESETS["tiny_qwen3_moe"]
E, K = CFG.num_experts, CFG.num_experts_per_tok
MOE_KEYS = {"verifier_moe_max_load", "verifier_moe_dropped_frac", "verifier_moe_dead_experts",
            "verifier_moe_routed_pairs"}


def _chosen(first, second):
    """h [1, N, D] and router [D, E] under which token n's top-2 experts are (first[n],
    second[n]): h[n] is 2 on first[n]'s coordinate and 1 on second[n]'s, the router is
    5 x the identity on the first E coordinates (logits 10, 5, 0, 0)."""
    h = np.zeros((1, len(first), CFG.dim), np.float32)
    h[0, np.arange(len(first)), first] = 2.0
    h[0, np.arange(len(first)), second] = 1.0
    router = np.zeros((CFG.dim, E), np.float32)
    router[np.arange(E), np.arange(E)] = 5.0
    return jnp.asarray(h), jnp.asarray(router)


def test_router_load_counts_known_choices_and_padding():
    # 6 tokens: pairs (0,1) (0,1) (0,2) (0,3) (1,2) (3,0); expert 0 gets 5 pairs.
    first, second = [0, 0, 0, 0, 1, 3], [1, 1, 2, 3, 2, 0]
    h, router = _chosen(first, second)
    _, experts = qwen3_moe.route(CFG, router, h[0])
    assert np.asarray(experts).tolist() == [list(p) for p in zip(first, second)]
    # Capacity factor 1: C = ceil(6 * 2 / 4) = 3 rows per expert; expert 0 drops its 4th and
    # 5th pairs (tokens 3 and 5, in (token, slot) order).
    cfg = CFG.replace(moe_capacity_factor=1.0, moe_dispatch="capacity")
    assert qwen3_moe.capacity(cfg, 6) == 3
    got = jax.device_get(qwen3_moe.router_load(cfg, router, h))
    assert got["pairs"].tolist() == [5, 3, 2, 2]
    assert int(got["dropped"]) == 2 and int(got["routed"]) == 12
    # Dropped fraction = dropped_pairs / (N k) when every token is real.
    assert int(got["dropped"]) == int(qwen3_moe.dropped_pairs(cfg, router, h))
    s = qwen3_moe.load_summary({k: np.asarray(v)[None] for k, v in got.items()})
    np.testing.assert_allclose(s["fraction"][0], [5 / 12, 3 / 12, 2 / 12, 2 / 12])
    np.testing.assert_allclose(s["max_load"], [5 * 4 / 12])
    np.testing.assert_allclose(s["dropped_frac"],
                               [int(qwen3_moe.dropped_pairs(cfg, router, h)) / (6 * K)])
    assert s["dead"].tolist() == [0]
    # Tokens 3 and 5 masked (padding): they still take capacity rows in the dispatch (so
    # C is still 3) but count nowhere. Expert 0 then holds tokens 0, 1, 2 (kept), and no
    # real pair is dropped; expert 3 gets no real pair: one dead expert.
    mask = jnp.asarray([[True, True, True, False, True, False]])
    got = jax.device_get(qwen3_moe.router_load(cfg, router, h, mask))
    assert got["pairs"].tolist() == [3, 3, 2, 0]
    assert int(got["dropped"]) == 0 and int(got["routed"]) == 8
    s = qwen3_moe.load_summary({k: np.asarray(v)[None] for k, v in got.items()})
    np.testing.assert_allclose(s["max_load"], [3 * 4 / 8])
    assert s["dead"].tolist() == [1]
    # "ragged" drops nothing.
    got = qwen3_moe.router_load(cfg.replace(moe_dispatch="ragged"), router, h)
    assert int(got["dropped"]) == 0 and np.asarray(got["pairs"]).tolist() == [5, 3, 2, 2]


def test_model_counts_equal_each_layers_router_load_and_dropped_pairs():
    """`router_load_counts` over a 2-layer model equals `router_load` of each layer's real
    feed-forward input (recorded from the per-layer form of `forward_hidden`, run eagerly),
    and its dropped counts equal `dropped_pairs` when no token is padding."""
    cfg = CFG.replace(moe_capacity_factor=0.5)  # C = ceil(0.5 * 16 * 2 / 4) = 4: drops
    params = registry.init_params(cfg, jax.random.PRNGKey(0))
    params["layers"]["router"] = params["layers"]["router"] * 50  # clear top-k choices
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 8), 1, cfg.vocab_size)
    for mask in (np.ones((2, 8), bool), np.arange(8)[None, :] >= np.array([[0], [3]])):
        mask = jnp.asarray(mask)
        positions = models.positions_from_mask(mask)
        got = jax.device_get(jax.jit(qwen3_moe.router_load_counts, static_argnums=1)(
            params, cfg, tokens, positions, mask))
        hs = []

        def recording(cfg_, p, h):
            hs.append(h)
            return qwen3_moe.moe_mlp(cfg_, p, h)

        cache = models.unstack_cache(models.init_cache(cfg, 2, 8))
        llama.forward_hidden(llama.unstack_layers(params), cfg, tokens, positions, mask,
                             cache, mlp=recording)
        assert len(hs) == cfg.num_layers
        for i, h in enumerate(hs):
            want = qwen3_moe.router_load(cfg, params["layers"]["router"][i], h, mask)
            assert got["pairs"][i].tolist() == np.asarray(want["pairs"]).tolist()
            assert int(got["dropped"][i]) == int(want["dropped"])
            assert int(got["routed"][i]) == int(mask.sum()) * K
            if bool(mask.all()):
                assert int(got["dropped"][i]) == int(qwen3_moe.dropped_pairs(
                    cfg, params["layers"]["router"][i], h))
        assert got["dropped"].sum() > 0 or not bool(mask.all())  # the capacity bites


def test_zero_router_sends_every_real_token_to_the_first_k_experts():
    """A zero router: equal probabilities, and top-k picks the lowest ids, experts 0 and 1,
    for every token; the step metric keys then read E / k = 2 (max load), E - k = 2 dead
    experts, and with C = ceil(0.5 * 10 * 2 / 4) = 3 of the 10 tokens' rows (left padding:
    tokens 0..3 are padding and take rows 0..3 first), all 6 real tokens are dropped from
    both experts: every real pair past row 3."""
    cfg = CFG.replace(moe_capacity_factor=0.5)
    params = registry.init_params(cfg, jax.random.PRNGKey(0))
    params["layers"]["router"] = jnp.zeros_like(params["layers"]["router"])
    tokens = jnp.ones((1, 10), jnp.int32)
    mask = jnp.asarray(np.arange(10)[None, :] >= 4)
    counts = jax.device_get(qwen3_moe.router_load_counts(
        params, cfg, tokens, models.positions_from_mask(mask), mask))
    assert counts["pairs"].tolist() == [[6, 6, 0, 0]] * cfg.num_layers
    assert counts["dropped"].tolist() == [12] * cfg.num_layers
    stats = {"moe_pairs": counts["pairs"], "moe_dropped": counts["dropped"],
             "moe_routed": counts["routed"]}
    assert verifier_moe_metrics(stats) == {
        "verifier_moe_max_load": 2.0, "verifier_moe_dropped_frac": 1.0,
        "verifier_moe_dead_experts": 2, "verifier_moe_routed_pairs": 12}
    assert verifier_moe_metrics({"prefixes": 3}) == {}  # a dense verifier: no keys


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory, smollm2_gguf):
    """A tiny round whose verifier is a real `Verifier` over tiny_qwen3_moe (random weights,
    the SmolLM2 tokenizer of the tiny config); the rubric generator is `test_phases`' stub."""
    from helpers import tiny_config
    from test_phases import StubGenerator
    c = tiny_config()
    c.model.verifier = "tiny_qwen3_moe"
    r = loop.setup(c, str(tmp_path_factory.mktemp("moe_run")))
    r.ctx = dataclasses.replace(r.ctx, generator=StubGenerator())
    yield r
    loop.close(r)


@pytest.mark.slow  # 10-21 s on 2 cores (make test-fast leaves it out)
def test_moe_verifier_step_metrics(moe_run):
    """Both phases' step metrics carry the router load of the MoE verifier's real passes;
    the same verifier calls with a dense model count none."""
    ctx = moe_run.ctx
    assert isinstance(ctx.verifier, Verifier) and ctx.verifier.cfg.family == "qwen3_moe"
    for step in (phases.policy_rollout(ctx, jax.random.PRNGKey(0), moe_run.data.prompts[:1]),
                 phases.generator_rollout(ctx, jax.random.PRNGKey(1),
                                          moe_run.data.train_anchors[:1])):
        m = step.metrics
        assert MOE_KEYS <= set(m), m
        assert 1.0 <= m["verifier_moe_max_load"] <= E / K
        # The default capacity factor (2) drops nothing at these sizes (C >= N k / 2 ...).
        assert 0.0 <= m["verifier_moe_dropped_frac"] <= 1.0
        assert 0 <= m["verifier_moe_dead_experts"] <= E - K
        assert m["verifier_moe_routed_pairs"] > 0 and m["verifier_moe_routed_pairs"] % K == 0
    # A dense verifier on the same texts: the counters, and no router load.
    dense_cfg = PRESETS["tiny"]
    dense = Verifier(dense_cfg, ctx.verifier.tokenizer, 256, 64)
    stats = {}
    dense.p_yes(registry.init_params(dense_cfg, jax.random.PRNGKey(0)), "Say hi.",
                ["hi", "hello"], ["Is it short?"], stats=stats)
    assert stats["prefixes"] == 2 and not set(stats) - {"prefix_cut", "item_cut",
                                                         "prefixes", "judgements"}
    assert verifier_moe_metrics(stats) == {}
