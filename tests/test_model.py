"""Tests of the decoder, its loaders/exporter and the tokenizer.

Random-weight tests use the tiny presets. Tests marked `real_model` load SmolLM2-135M-Instruct
once (session fixture `smollm2`) and compare it with `../shared/fixtures/smollm2_reference.npz`,
outputs of transformers' own GGUF dequantisation and torch `LlamaForCausalLM` (float32).
"""
import json
import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from drubric_jax import models
from drubric_jax.text import tokenizer as tok_lib
from drubric_jax.models import config as cfg_lib
from drubric_jax.models import llama, weights
from helpers import llama_cpp_permute, write_tiny_gguf
from tolerances import greedy_agreement

TINY_PRESETS = ["tiny", "tiny_qwen3", "tiny_llama31"]
# Logits vs the torch reference. They reach ~40 (one float32 ulp there: 3.8e-6); two float32
# implementations (each its own GGUF dequantisation; 30 layers of D = 576 sums in another
# order) were measured <= 1e-4 apart. 2e-3 (5e-5 of the logit scale) leaves 20x headroom for
# other CPUs and is far below a real bug (a wrong RoPE or Q/K permutation moves logits by units).
PARITY_TOL = 2e-3


# --------------------------------------------------------------------------- helpers


@jax.jit
def _argmax_last(logits):
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)


_forward_jit = jax.jit(
    lambda params, tokens, mask, cfg: models.apply(
        params, cfg, tokens, models.positions_from_mask(mask), token_mask=mask)[0],
    static_argnames="cfg")

_step_jit = jax.jit(
    lambda params, tokens, mask, positions, cache, cfg: models.apply(
        params, cfg, tokens, positions, cache=cache, token_mask=mask),
    static_argnames="cfg")


def _forward(params, cfg, tokens, mask):
    """Full (no-cache) forward with positions from the mask. Jitted per (cfg, shape)."""
    return _forward_jit(params, tokens, mask, cfg=cfg)


def _left_pad(seqs, pad_id=0, length=None):
    """Left-pads lists of ids: (tokens int32[B, T], mask bool[B, T])."""
    length = length or max(len(s) for s in seqs)
    tokens = np.full((len(seqs), length), pad_id, np.int32)
    mask = np.zeros((len(seqs), length), bool)
    for i, s in enumerate(seqs):
        if len(s):
            tokens[i, length - len(s):] = s
            mask[i, length - len(s):] = True
    return jnp.asarray(tokens), jnp.asarray(mask)


def _greedy(params, cfg, prompts, num_steps, stop_id=None, pad_id=0):
    """Greedy decoding with the KV cache: prefill the left-padded batch, then one token a step.

    Returns one list of new ids per prompt, cut after the first `stop_id`.
    """
    tokens, mask = _left_pad(prompts, pad_id)
    b, t = tokens.shape
    cache = models.init_cache(cfg, b, t + num_steps)
    positions = models.positions_from_mask(mask)
    logits, cache = _step_jit(params, tokens, mask, positions, cache, cfg=cfg)
    next_pos = positions[:, -1:] + 1
    step_mask = jnp.ones((b, 1), bool)
    out = []
    for _ in range(num_steps):
        nxt = _argmax_last(logits)
        out.append(np.asarray(nxt))
        logits, cache = _step_jit(params, nxt[:, None], step_mask, next_pos, cache, cfg=cfg)
        next_pos = next_pos + 1
    out = np.stack(out, axis=1)
    result = []
    for row in out:
        row = row.tolist()
        if stop_id is not None and stop_id in row:
            row = row[:row.index(stop_id) + 1]
        result.append(row)
    return result


def _tree_equal_bitwise(a, b):
    la, ta = jax.tree_util.tree_flatten_with_path(a)
    lb, tb = jax.tree_util.tree_flatten_with_path(b)
    assert ta == tb, "parameter trees differ in structure"
    for (path, x), (_, y) in zip(la, lb):
        assert x.dtype == y.dtype, (path, x.dtype, y.dtype)
        assert x.shape == y.shape, (path, x.shape, y.shape)
        xb = np.asarray(x).view(np.uint16 if x.dtype == jnp.bfloat16 else np.uint32)
        yb = np.asarray(y).view(np.uint16 if y.dtype == jnp.bfloat16 else np.uint32)
        assert np.array_equal(xb, yb), f"{jax.tree_util.keystr(path)} not bitwise equal"


@pytest.fixture(scope="module")
def reference(shared_file):
    path = shared_file("fixtures", "smollm2_reference.npz")
    with open(shared_file("fixtures", "smollm2_reference.json")) as f:
        meta = json.load(f)
    return dict(np.load(path)), meta


# --------------------------------------------------------------------------- real model parity


@pytest.mark.real_model
def test_tokenizer_chat_ids_match_reference(smollm2, reference):
    _, _, tok = smollm2
    ref, meta = reference
    assert tok.bos_token_id == 1
    for i, prompt in enumerate(meta["prompts"]):
        ids = tok_lib.chat_ids(tok, prompt["messages"])
        np.testing.assert_array_equal(ids, ref[f"p{i}_input_ids"])
        # The chat template supplies the one BOS; the tokenizer adds none of its own.
        assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id
        assert tok.encode(prompt["chat_text"]) == ids
        assert tok.apply_chat_template(prompt["messages"], tokenize=False,
                                       add_generation_prompt=True) == prompt["chat_text"]


@pytest.mark.real_model
def test_logits_match_reference_every_position(smollm2, reference):
    cfg, params, _ = smollm2
    ref, meta = reference
    assert cfg == cfg_lib.SMOLLM2_135M
    for i in range(len(meta["prompts"])):
        ids = ref[f"p{i}_input_ids"]
        tokens = jnp.asarray(ids[None], jnp.int32)
        logits = np.asarray(_forward(params, cfg, tokens, jnp.ones_like(tokens, bool))[0])
        topk_idx, topk_val = ref[f"p{i}_topk_idx"], ref[f"p{i}_topk_val"]
        got = np.take_along_axis(logits, topk_idx, axis=-1)
        per_pos = np.abs(got - topk_val).max(axis=-1)
        last = np.abs(logits[-1] - ref[f"p{i}_last_logits"]).max()
        print(f"\n[parity] prompt {i}: T={len(ids)} top-64 max|diff|={per_pos.max():.3e} "
              f"(worst position {per_pos.argmax()}), last-position full-vocab "
              f"max|diff|={last:.3e}")
        assert per_pos.max() <= PARITY_TOL, per_pos
        assert last <= PARITY_TOL
        # The reference's top-1 is ours at every position.
        np.testing.assert_array_equal(logits.argmax(-1), topk_idx[:, 0])


@pytest.mark.real_model
def test_greedy_with_cache_matches_reference(smollm2, reference):
    """Batched (left-padded) prefill + 40 cached decode steps reproduce the reference, up to
    a near tie: both implementations' logits are within PARITY_TOL of each other (test
    above), so where the reference's token is not our argmax, our margin between the two is
    at most 2 * PARITY_TOL if the step was a tie that rounding may break either way. Such a
    step ends the comparison (the continuations then condition on different tokens)."""
    cfg, params, tok = smollm2
    ref, meta = reference
    prompts = [ref[f"p{i}_input_ids"].tolist() for i in range(len(meta["prompts"]))]
    got = _greedy(params, cfg, prompts, 40, stop_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    for i, row in enumerate(got):
        want = ref[f"p{i}_greedy_ids"].tolist()

        def margin_at(j, prompt=prompts[i], want=want):
            tokens = jnp.asarray([prompt + want[:j]], jnp.int32)
            logits = np.asarray(_forward(params, cfg, tokens, jnp.ones_like(tokens, bool)))
            return logits[0, -1].max() - logits[0, -1, want[j]]

        n_match = greedy_agreement(row, want, margin_at, max_margin=2 * PARITY_TOL)
        print(f"\n[greedy] prompt {i}: {n_match}/{len(want)} tokens match; "
              f"text={tok.decode(row, skip_special_tokens=True)!r}")
        if n_match == len(want):
            assert tok.decode(row, skip_special_tokens=True) == meta["prompts"][i]["greedy_text"]


@pytest.mark.real_model
def test_greedy_answer_capital_of_france(smollm2):
    cfg, params, tok = smollm2
    ids = tok_lib.chat_ids(tok, [{"role": "user", "content": "What is the capital of France?"}])
    (row,) = _greedy(params, cfg, [ids], 16, stop_id=tok.eos_token_id)
    assert "Paris" in tok.decode(row, skip_special_tokens=True)


# --------------------------------------------------------------------------- tiny models


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_cached_decode_equals_full_forward(name):
    """Prefill part of a left-padded batch, decode the rest one token at a time with the
    cache: the logits at every real position equal those of one full forward pass."""
    cfg = cfg_lib.preset(name)
    params = models.init_params(cfg, jax.random.PRNGKey(1))
    rng = np.random.default_rng(0)
    lengths, t, n_prefill = [12, 9, 4], 12, 6
    seqs = [rng.integers(3, cfg.vocab_size, n).tolist() for n in lengths]
    tokens, mask = _left_pad(seqs, length=t)
    positions = models.positions_from_mask(mask)
    full = np.asarray(_forward(params, cfg, tokens, mask))

    cache = models.init_cache(cfg, len(seqs), 16)
    pieces = []
    logits, cache = _step_jit(params, tokens[:, :n_prefill], mask[:, :n_prefill],
                              positions[:, :n_prefill], cache, cfg=cfg)
    pieces.append(logits)
    for j in range(n_prefill, t):
        logits, cache = _step_jit(params, tokens[:, j:j + 1], mask[:, j:j + 1],
                                  positions[:, j:j + 1], cache, cfg=cfg)
        pieces.append(logits)
    assert int(cache.index) == t
    np.testing.assert_array_equal(np.asarray(cache.valid[:, :t]), np.asarray(mask))
    cached = np.asarray(jnp.concatenate(pieces, axis=1))
    m = np.asarray(mask)
    np.testing.assert_allclose(cached[m], full[m], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", TINY_PRESETS)
@pytest.mark.parametrize("per_layer", [False, True])
def test_fresh_cache_prefill_reads_only_its_own_tokens(name, per_layer):
    """A prefill into a cache fresh from `init_cache` (`KVCache.empty`) attends over its own
    T tokens only; it gives the logits and the cache of the general cached path (the same
    cache marked not empty: attention over all S slots, the empty ones masked), and it never
    reads the S - T slots it leaves empty (NaN there stays out of its logits)."""
    cfg = cfg_lib.preset(name)
    params = models.init_params(cfg, jax.random.PRNGKey(1))
    if per_layer:
        params = llama.unstack_layers(params)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(3, cfg.vocab_size, n).tolist() for n in (9, 4, 7)]
    tokens, mask = _left_pad(seqs, length=9)
    positions = models.positions_from_mask(mask)

    def prefill(cache):
        cache = models.unstack_cache(cache) if per_layer else cache
        return _step_jit(params, tokens, mask, positions, cache, cfg=cfg)

    fresh = models.init_cache(cfg, len(seqs), 16)
    assert fresh.empty
    logits, cache = prefill(fresh)
    general_logits, general_cache = prefill(fresh.replace(empty=False))
    assert not cache.empty and int(cache.index) == 9
    m = np.asarray(mask)
    # The same operations, except that the general path also sums the masked slots' exact
    # zeros (exp of the mask value, 0 * v): measured bitwise equal here; 1e-5 leaves room
    # for another CPU's summation order (logits here are O(1)).
    np.testing.assert_allclose(np.asarray(logits)[m], np.asarray(general_logits)[m],
                               atol=1e-5, rtol=0)
    stacked = models.stack_cache(cache), models.stack_cache(general_cache)
    for kind in ("k", "v"):
        np.testing.assert_allclose(np.asarray(getattr(stacked[0], kind)),
                                   np.asarray(getattr(stacked[1], kind)), atol=1e-5, rtol=0)
    np.testing.assert_array_equal(np.asarray(cache.valid), np.asarray(general_cache.valid))

    poisoned = fresh.replace(v=jnp.full_like(fresh.v, jnp.nan))
    assert np.isfinite(np.asarray(prefill(poisoned)[0])[m]).all()
    # The general path reads every slot: NaN there reaches the logits (this is what the
    # fresh path avoids, and shows the check above can fail).
    assert not np.isfinite(np.asarray(prefill(poisoned.replace(empty=False))[0])[m]).all()


def test_padding_invariance(tiny_model):
    """One prompt, left-padded by different amounts among other prompts, same last logits."""
    cfg, params = tiny_model
    rng = np.random.default_rng(1)
    prompt = rng.integers(3, cfg.vocab_size, 7).tolist()
    others = [rng.integers(3, cfg.vocab_size, n).tolist() for n in (3, 11, 14)]
    alone = np.asarray(_forward(params, cfg, *_left_pad([prompt]))[0, -1])
    # Pad amounts 4 and 13 for the prompt, among rows with other pad amounts.
    for batch, length in (([others[1], prompt, others[0]], 11),
                          ([others[0], others[2], prompt], 20)):
        tokens, mask = _left_pad(batch, length=length)
        logits = np.asarray(_forward(params, cfg, tokens, mask))
        row = batch.index(prompt)
        np.testing.assert_allclose(logits[row, -1], alone, atol=1e-5, rtol=0)


def test_rope_inverse_frequencies():
    # No scaling: 1 / theta^(2i/d).
    cfg = cfg_lib.TINY
    inv = np.asarray(llama.rope_inv_freq(cfg))
    d = cfg.head_dim
    want = [1.0 / cfg.rope_theta ** (2 * i / d) for i in range(d // 2)]
    np.testing.assert_allclose(inv, want, rtol=1e-6)

    # Llama-3.1 scaling, Hugging Face `_compute_llama3_parameters`, written out per index.
    def hf_llama3(base, dim, factor, low, high, old_ctx):
        out = []
        for i in range(dim // 2):
            f = 1.0 / base ** (2 * i / dim)
            wavelen = 2 * math.pi / f
            if wavelen < old_ctx / high:
                out.append(f)
            elif wavelen > old_ctx / low:
                out.append(f / factor)
            else:
                smooth = (old_ctx / wavelen - low) / (high - low)
                out.append((1 - smooth) * f / factor + smooth * f)
        return np.array(out)

    for cfg in (cfg_lib.LLAMA3_1_8B, cfg_lib.TINY_LLAMA31):
        s = cfg.rope_scaling
        want = hf_llama3(cfg.rope_theta, cfg.head_dim, s.factor, s.low_freq_factor,
                         s.high_freq_factor, s.original_max_position_embeddings)
        got = np.asarray(llama.rope_inv_freq(cfg))
        np.testing.assert_allclose(got, want, rtol=2e-6)
    # Llama-3.1-8B: the three bands are all present, checked at hand-picked indices.
    got = np.asarray(llama.rope_inv_freq(cfg_lib.LLAMA3_1_8B))
    base = 500000.0
    assert got[0] == pytest.approx(1.0, rel=1e-7)  # high frequency: unchanged
    assert got[63] == pytest.approx(base ** (-126 / 128) / 8, rel=1e-6)  # low: divided by 8
    f = base ** (-2 * 32 / 128)  # wavelength ~4.4k tokens, between 2048 and 8192: mixed
    smooth = (8192 / (2 * math.pi / f) - 1) / 3
    assert 0 < smooth < 1
    assert got[32] == pytest.approx((1 - smooth) * f / 8 + smooth * f, rel=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", TINY_PRESETS)
def test_export_import_round_trip_exact(name, dtype, tmp_path):
    cfg = cfg_lib.preset(name).replace(dtype=dtype, param_dtype=dtype)
    params = models.init_params(cfg, jax.random.PRNGKey(2))
    # Distinct norm values, so a swapped or mis-transposed tensor cannot pass.
    params["final_norm"] = params["final_norm"] + jnp.arange(cfg.dim, dtype=params[
        "final_norm"].dtype) / 64
    models.export_hf_dir(params, cfg, str(tmp_path))
    cfg2, params2 = models.load_hf_dir(str(tmp_path), dtype=dtype)
    assert cfg2 == cfg
    _tree_equal_bitwise(params, params2)


def test_export_to_a_url_is_copied_there_not_to_a_local_gs_folder(tmp_path, monkeypatch):
    """A gs://-style export directory (a TPU pod's workdir): the files are written locally
    and copied with etils.epath, here onto a fake bucket (epath.Path mapped to a folder);
    nothing lands in a local "fake:" folder, and the copy loads back exactly."""
    from etils import epath

    cfg = cfg_lib.preset("tiny")
    params = models.init_params(cfg, jax.random.PRNGKey(2))
    bucket, real_path = tmp_path / "bucket", epath.Path

    def fake_path(*parts):
        joined = os.path.join(*map(str, parts))
        return real_path(joined.replace("fake://", str(bucket) + "/"))

    monkeypatch.setattr(epath, "Path", fake_path)
    monkeypatch.chdir(tmp_path)
    models.export_hf_dir(params, cfg, "fake://run/export/policy")
    assert not (tmp_path / "fake:").exists()
    assert sorted(os.listdir(bucket / "run/export/policy")) == ["config.json",
                                                                 "model.safetensors"]
    cfg2, params2 = models.load_hf_dir(str(bucket / "run/export/policy"), dtype=cfg.dtype)
    assert cfg2 == cfg
    _tree_equal_bitwise(params, params2)


def test_config_from_hf_presets():
    """Hand-written config.json dicts of Llama-3.1-8B(-Instruct) and Qwen3-8B equal the presets.

    `config_from_hf` takes dtype from its argument (config.json's torch_dtype is ignored);
    max_seq_len comes from max_position_embeddings, which the presets also use.
    """
    llama31 = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 131072, "mlp_bias": False, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "use_cache": True, "vocab_size": 128256}
    qwen3 = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 12288,
        "max_position_embeddings": 40960, "max_window_layers": 36, "num_attention_heads": 32,
        "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936}
    assert weights.config_from_hf(llama31, "bfloat16") == cfg_lib.LLAMA3_1_8B
    assert weights.config_from_hf(qwen3, "bfloat16") == cfg_lib.QWEN3_8B
    # transformers 5 writes the RoPE settings under "rope_parameters" instead.
    l5 = {k: v for k, v in llama31.items() if k not in ("rope_scaling", "rope_theta")}
    l5["rope_parameters"] = dict(llama31["rope_scaling"], rope_theta=500000.0)
    assert weights.config_from_hf(l5, "bfloat16") == cfg_lib.LLAMA3_1_8B
    q5 = {k: v for k, v in qwen3.items() if k not in ("rope_scaling", "rope_theta")}
    q5["rope_parameters"] = {"rope_theta": 1000000.0, "rope_type": "default"}
    assert weights.config_from_hf(q5, "bfloat16") == cfg_lib.QWEN3_8B
    with pytest.raises(ValueError, match="model_type"):
        weights.config_from_hf(dict(llama31, model_type="mistral"))
    with pytest.raises(ValueError, match="rope_scaling type"):
        weights.config_from_hf(dict(llama31, rope_scaling={"rope_type": "yarn", "factor": 4.0}))


# --------------------------------------------------------------------------- GGUF / sharding


@pytest.mark.parametrize("n_head,head_dim,inp", [(9, 64, 576), (3, 64, 576), (4, 16, 8)])
def test_gguf_qk_unpermute_inverts_llama_cpp(n_head, head_dim, inp):
    w = np.random.default_rng(0).standard_normal((n_head * head_dim, inp)).astype(np.float32)
    permuted = llama_cpp_permute(w, n_head)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(weights._unpermute_rows(permuted, n_head), w)
    np.testing.assert_array_equal(llama_cpp_permute(weights._unpermute_rows(w, n_head), n_head),
                                  w)


def _w_up_sharding():
    assert jax.device_count() >= 8, "tests/conftest.py sets 8 fake CPU devices"
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("model",))
    target = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, None, "model"))
    requested = []

    def shardings(path, shape):
        requested.append((path, tuple(shape)))
        return target if path == "layers/w_up" else None

    return target, shardings, requested


def test_assemble_places_leaves_on_requested_sharding(tiny_model):
    cfg, params = tiny_model
    target, shardings, requested = _w_up_sharding()

    def read(key, layer):  # back to the [out, in] file layout
        w = np.asarray(params[key] if layer is None else params["layers"][key][layer])
        return f"{key}[{layer}]", (w.T if w.ndim == 2 and key not in ("embed",) else w)

    loaded = weights._assemble(cfg, read, shardings, "test")
    assert loaded["layers"]["w_up"].sharding == target
    assert len(loaded["layers"]["w_up"].sharding.device_set) == 8
    names = {p for p, _ in requested}
    assert "layers/wq" in names and "embed" in names
    assert ("layers/w_up", tuple(params["layers"]["w_up"].shape)) in requested
    _tree_equal_bitwise(params, loaded)


@pytest.mark.parametrize("tied", [True, False])
def test_load_gguf_tiny_round_trip_into_sharding(tied, tmp_path):
    """A llama.cpp-layout GGUF of a tiny model loads back to the same config and params
    (Q/K permutation undone, tied/untied head detected), with w_up on the requested sharding."""
    target, shardings, _ = _w_up_sharding()
    cfg = cfg_lib.TINY.replace(tie_embeddings=tied)
    params = models.init_params(cfg, jax.random.PRNGKey(3))
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, cfg, params)
    cfg2, loaded = models.load_gguf(str(path), shardings=shardings)
    assert cfg2 == cfg
    _tree_equal_bitwise(params, loaded)
    assert loaded["layers"]["w_up"].sharding == target
    assert len(loaded["layers"]["w_up"].sharding.device_set) == 8


# --------------------------------------------------------------------------- HF export, real


@pytest.fixture(scope="module")
def smollm2_hf_dir(smollm2, tmp_path_factory):
    cfg, params, tok = smollm2
    directory = tmp_path_factory.mktemp("smollm2_hf")
    models.export_hf_dir(params, cfg, str(directory), tok,
                         bos_id=tok.bos_token_id, eos_id=tok.eos_token_id)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)  # ~540 MB of float32 weights


@pytest.mark.real_model
def test_smollm2_export_round_trip(smollm2, smollm2_hf_dir):
    cfg, params, tok = smollm2
    cfg2, params2, tok2 = models.load_model(str(smollm2_hf_dir))
    assert cfg2 == cfg
    _tree_equal_bitwise(params, params2)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    assert tok_lib.chat_ids(tok2, msgs) == tok_lib.chat_ids(tok, msgs)


@pytest.mark.real_model
def test_smollm2_export_loads_in_transformers(smollm2, smollm2_hf_dir, reference):
    from transformers import AutoConfig, AutoTokenizer

    cfg, _, tok = smollm2
    ref, meta = reference
    hf_cfg = AutoConfig.from_pretrained(str(smollm2_hf_dir))
    assert hf_cfg.model_type == "llama"
    assert (hf_cfg.hidden_size, hf_cfg.num_hidden_layers, hf_cfg.num_attention_heads,
            hf_cfg.num_key_value_heads, hf_cfg.intermediate_size, hf_cfg.vocab_size) == (
                cfg.dim, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.hidden_dim,
                cfg.vocab_size)
    assert hf_cfg.tie_word_embeddings is True
    hf_tok = AutoTokenizer.from_pretrained(str(smollm2_hf_dir))
    for i, prompt in enumerate(meta["prompts"]):
        text = hf_tok.apply_chat_template(prompt["messages"], tokenize=False,
                                          add_generation_prompt=True)
        assert text == prompt["chat_text"]
        ids = hf_tok.encode(text, add_special_tokens=False)
        np.testing.assert_array_equal(ids, ref[f"p{i}_input_ids"])
        assert hf_tok(text)["input_ids"] == ids  # default call adds no BOS either
    assert hf_tok.eos_token_id == tok.eos_token_id == 2
