"""The rollout engine (drubric_jax/sampling/engine.py): continuous batching over decode
slots gives each row what `generate` gives it alone, with one prefill per prompt."""
import os

import jax
import numpy as np
import pytest

from drubric_jax import sampling
from drubric_jax.sampling import engine
from helpers import RowRule
from tolerances import logprob_atol

N = 10
# Prompts in three buckets (16, 32, 64 with min_bucket 16).
LENGTHS = (3, 20, 40, 7, 18, 33)


def _prompts(cfg, lengths=LENGTHS, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, cfg.vocab_size, size=n).tolist() for n in lengths]


def _alone(params, cfg, prompts, ids, **kw):
    """Each row by `generate` alone (a batch of one: no other row shapes its decode)."""
    return [sampling.generate(params, cfg, [p], row_ids=[i], **kw) for p, i in zip(prompts, ids)]


def _stops_at_varied_steps(params, cfg, prompts, ids, **kw):
    """Two stop ids, from the rows as `generate` writes them without stops: row 0's first
    token (row 0 stops on it), and the first token of another row at a step in [2, N - 2]
    that row has not written before, where it has not met the first stop yet (that row
    stops mid-way)."""
    free = _alone(params, cfg, prompts, ids, **dict(kw, stop_ids=[cfg.vocab_size - 1]))
    rows = [a.tokens[0].tolist() for a in free]
    stops = [rows[0][0]]
    for row in rows[1:]:
        for j in range(2, N - 1):
            if row[j] not in row[:j] and stops[0] not in row[:j + 1]:
                return stops + [row[j]]
    raise AssertionError(f"no row stops mid-way for these seeds: {rows}")


def _assert_rows_equal(got, alone, vocab):
    for r, want in enumerate(alone):
        np.testing.assert_array_equal(got.tokens[r], want.tokens[0], err_msg=f"row {r}")
        np.testing.assert_array_equal(got.mask[r], want.mask[0], err_msg=f"row {r}")
        np.testing.assert_array_equal(got.truncated[r], want.truncated[0])
        np.testing.assert_allclose(got.logprobs[r], want.logprobs[0], rtol=0,
                                   atol=logprob_atol(want.logprobs[0], vocab))


def _model_and_prompts(request, method):
    """Sampled: the tiny random model. Greedy: its untied-head variant TINY_QWEN3 (with
    tied embeddings a random model's greedy rows repeat one token, so no row would stop
    mid-way)."""
    if not isinstance(method, sampling.Greedy):
        cfg, params = request.getfixturevalue("tiny_model")
    else:
        from drubric_jax.models import config, init_params

        cfg = config.TINY_QWEN3
        params = init_params(cfg, jax.random.PRNGKey(0))
    return cfg, params, _prompts(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("method", [sampling.Greedy(), sampling.Temperature(1.0)],
                         ids=["greedy", "sampled"])
def test_engine_rows_equal_generate(request, method):
    """Each row's tokens, mask and truncation equal `generate`'s for that row alone (its
    row_ids draws), and its log-probs agree within float32 rounding (its keys sit in other
    cache positions, so the attention sums run in another order). Rows stop at different
    steps (one on its first token, one at N), prompts fall in several buckets, and 3 slots
    serve 6 rows, so slots turn over mid-run; one decode and one insert program serve it."""
    cfg, params, prompts = _model_and_prompts(request, method)
    ids = [10 + 3 * r for r in range(len(prompts))]
    kw = dict(key=jax.random.PRNGKey(2), max_new_tokens=N, method=method)
    stops = _stops_at_varied_steps(params, cfg, prompts, ids, **kw)
    alone = _alone(params, cfg, prompts, ids, stop_ids=stops, **kw)
    lengths = [int(a.lengths[0]) for a in alone]
    assert lengths[0] == 1 and any(1 < n < N for n in lengths) and N in lengths, lengths

    stats = {}
    got = sampling.generate_engine(params, cfg, prompts, num_slots=3, row_ids=ids,
                                 stop_ids=stops, steps_per_call=3, stats=stats, **kw)
    _assert_rows_equal(got, alone, cfg.vocab_size)
    assert stats["inserts"] == len(prompts) and stats["calls"] > 2
    again = sampling.generate_engine(params, cfg, prompts[::-1], num_slots=3,
                                     row_ids=ids[::-1], stop_ids=stops, steps_per_call=3, **kw)
    np.testing.assert_array_equal(again.tokens[::-1], got.tokens)
    # The rollout's prompts as `generate` returns them: left-padded to the longest's bucket.
    assert got.prompt_tokens.shape == (len(prompts), sampling.bucket_length(
        max(map(len, prompts)), 16))
    np.testing.assert_array_equal(got.lengths, got.mask.sum(-1))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_rows_equal_generate_chunked_in_mixed_buckets(dtype):
    """The engine (3 slots, a paged cache, prompts of the 16, 32 and 64 buckets, K = 2 rows
    a prompt) against `generate_chunked` as runs call it (4 rows a call, every call padded
    to the longest prompt's bucket), both drawing by row id: the same tokens and masks on
    every row, and log-probs within float32 rounding. In bfloat16 both round the same
    quantities (weights, activations, keys and values) to bfloat16 and differ only in the
    order of float32 sums (the attention over pages or over a padded cache), so the
    float32 tolerance holds there too; a near-tie of bfloat16 values could flip one
    rounding and a token, which these rows do not meet."""
    from drubric_jax.models import config, init_params

    cfg = config.TINY.replace(dtype=dtype, param_dtype=dtype)
    params = init_params(cfg, jax.random.PRNGKey(0))
    prompts = [p for p in _prompts(cfg) for _ in range(2)]
    ids = list(range(100, 100 + len(prompts)))
    kw = dict(key=jax.random.PRNGKey(1), max_new_tokens=N, method=sampling.Temperature(1.0))
    kw.update(stop_ids=_stops_at_varied_steps(params, cfg, prompts, ids, **kw), row_ids=ids)
    got = sampling.generate_engine(params, cfg, prompts, num_slots=3, **kw)
    want = sampling.generate_chunked(params, cfg, prompts, 4, **kw)
    assert got.lengths.min() < N  # some rows stop before N: slots turn over mid-rollout
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.mask, want.mask)
    np.testing.assert_array_equal(got.truncated, want.truncated)
    np.testing.assert_array_equal(got.prompt_tokens, want.prompt_tokens)
    np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=0,
                               atol=logprob_atol(want.logprobs, cfg.vocab_size))


@pytest.mark.slow
def test_engine_constrained_rows_equal_generate(tiny_model):
    """Under a constraint (one per slot, renewed at each insert; the host fills the masks
    while the device runs the forward) every row equals `generate`'s under the same
    constraint alone: tokens inside the allowed half at even steps, the forced stop after
    `limit` tokens, log-probs of the unconstrained logits within float32 rounding."""
    cfg, params = tiny_model
    prompts = _prompts(cfg, lengths=(6, 25, 3, 14, 40), seed=4)
    ids = [3, 1, 4, 1 + 5, 9]
    kw = dict(key=jax.random.PRNGKey(6), max_new_tokens=8, method=sampling.Temperature(1.0),
              stop_ids=[2])
    got = sampling.generate_engine(params, cfg, prompts, num_slots=2, row_ids=ids,
                                   constraint=RowRule(cfg.vocab_size, 5), **kw)
    alone = [sampling.generate(params, cfg, [p], row_ids=[i],
                               constraint=RowRule(cfg.vocab_size, 5), **kw)
             for p, i in zip(prompts, ids)]
    _assert_rows_equal(got, alone, cfg.vocab_size)
    assert (got.lengths == 6).all() and (got.tokens[:, 5] == 2).all()  # forced stops
    assert (got.tokens[:, 0:5:2] < cfg.vocab_size // 2).all()  # the constraint bit


@pytest.mark.slow
def test_engine_json_rows_equal_generate_and_parse(tiny_model, smollm2_tokenizer):
    """With llguidance's JSON-schema constraint (`JsonSchemaConstraint`, one matcher per
    slot, renewed at each insert) 2 slots serve 5 rows of a random-weight model: every row
    is `generate`'s row alone under the same schema, and a complete document."""
    import json

    from drubric_jax.sampling.constrained import JsonSchemaConstraint
    from drubric_jax.text import tokenizer as tok_lib
    from drubric_jax.text.rubric_format import RUBRIC_JSON_SCHEMA

    cfg, params = tiny_model
    tok = smollm2_tokenizer
    schema = RUBRIC_JSON_SCHEMA(1, 10)
    # A bound as in test_sampling's JSON test: 12 + (11 + 6 * 10 + 12) + 2 bytes, + stop.
    bound = 12 + (11 + 60 + 12) + 2 + 1
    texts = ("Write a rubric as JSON.", "One rubric item, please, as JSON.", "JSON rubric")
    prompts = [tok_lib.chat_ids(tok, [{"role": "user", "content": t}]) for t in texts]
    prompts = prompts + prompts[:2]
    ids = list(range(20, 25))
    kw = dict(key=jax.random.PRNGKey(1), max_new_tokens=bound,
              method=sampling.Temperature(1.0), stop_ids=tok_lib.stop_ids(tok).tolist())

    def constraint():
        return JsonSchemaConstraint(tok, schema, cfg.vocab_size, tok.eos_token_id)

    got = sampling.generate_engine(params, cfg, prompts, num_slots=2, row_ids=ids,
                                   constraint=constraint(), **kw)
    alone = [sampling.generate(params, cfg, [p], row_ids=[i], constraint=constraint(), **kw)
             for p, i in zip(prompts, ids)]
    _assert_rows_equal(got, alone, cfg.vocab_size)
    assert not got.truncated.any() and not got.invalid.any()
    for row, mask in zip(got.tokens, got.mask):
        doc = json.loads(tok.decode(row[mask][:-1].tolist(), skip_special_tokens=False))
        assert len(doc["rubrics"]) == 1


@pytest.mark.slow
def test_each_program_compiles_once_in_a_fresh_process():
    """In a fresh process (no program compiled before; tests/engine_compiles_driver.py,
    JAX's compile log), a rollout over prompts of three buckets compiles one prefill and
    one prefix store per bucket, one insert, and one decode program per read bucket it
    used (`engine.read_bucket`); a second rollout of other rows compiles only the decode
    programs of read buckets the first did not use."""
    import json
    import subprocess
    import sys

    from conftest import xla_flags_with_device_count

    driver = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          "engine_compiles_driver.py")
    env = dict(os.environ, XLA_FLAGS=xla_flags_with_device_count(os.environ["XLA_FLAGS"], 1))
    proc = subprocess.run([sys.executable, driver], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    buckets = len(out["buckets"])
    first, second = out["first"], out["second"]
    reads, reads_again = (set(r) for r in out["read_pages"])
    assert buckets == 3
    assert first["prefill_prompt"] == first["store_prefix"] == buckets, first
    assert first["insert"] == 1 and first["decode_steps"] == len(reads), first
    for name in ("prefill_prompt", "store_prefix", "insert"):
        assert name not in second, second
    assert second.get("decode_steps", 0) == len(reads_again - reads), (second, reads,
                                                                        reads_again)


def test_k_samples_share_one_prefill(tiny_model):
    """A prompt's K consecutive rows are prefilled once and stored once: 4 prompts x K = 3
    rows run 4 prefills and 4 prefix stores, the pool holds 5 slots' own pages and prefix
    pages for 2 ceil(5 / 3) + 1 = 5 prompts at most (`default_prefix_pages`), not 12 rows'
    prompts; every row equals `generate`'s (two rows of one prompt differ: their draw ids
    differ). With prefix pages for one prompt, a slot waits for them and the rows are the
    same."""
    from drubric_jax.models import paged
    cfg, params = tiny_model
    base = _prompts(cfg, lengths=(5, 21, 9, 2), seed=1)
    prompts = [p for p in base for _ in range(3)]
    ids = list(range(len(prompts)))
    kw = dict(key=jax.random.PRNGKey(5), max_new_tokens=6, method=sampling.Temperature(1.0),
              stop_ids=[2])
    stats = {}
    got = sampling.generate_engine(params, cfg, prompts, num_slots=5, row_ids=ids,
                                 stats=stats, **kw)
    assert stats["prefills"] == stats["stores"] == len(base)
    assert stats["inserts"] == len(prompts)
    own = paged.pages_for(stats["page_size"] - 1 + 6, stats["page_size"])
    prompt_pages = paged.pages_for(32, stats["page_size"])        # the 32 bucket
    assert stats["pool_pages"] == 1 + 5 * own + 4 * prompt_pages  # 4 prompts < 5
    assert stats["prefix_pages_peak"] <= 4 * prompt_pages and stats["waits"] == 0
    alone = _alone(params, cfg, prompts, ids, **kw)
    _assert_rows_equal(got, alone, cfg.vocab_size)
    assert (got.tokens[0] != got.tokens[1]).any()
    # Pages for one prompt: the slots of the next prompt wait until the last one's rows end.
    tight = {}
    got = sampling.generate_engine(params, cfg, prompts, num_slots=5, row_ids=ids,
                                   stats=tight, prefix_pages=prompt_pages, **kw)
    _assert_rows_equal(got, alone, cfg.vocab_size)
    assert tight["waits"] > 0 and tight["prefix_pages_peak"] <= prompt_pages
    with pytest.raises(ValueError, match="prefix_pages"):
        sampling.generate_engine(params, cfg, prompts, num_slots=5, row_ids=ids,
                                 prefix_pages=prompt_pages - 1, **kw)


def test_engine_with_more_slots_than_rows_and_one_slot(tiny_model):
    """E > B (idle slots) and E = 1 (every row waits for the one before) give the same
    rows."""
    cfg, params = tiny_model
    prompts = _prompts(cfg, lengths=(4, 11), seed=2)
    kw = dict(key=jax.random.PRNGKey(7), max_new_tokens=5, method=sampling.Temperature(0.7),
              stop_ids=[2])
    wide = sampling.generate_engine(params, cfg, prompts, num_slots=4, **kw)
    one = sampling.generate_engine(params, cfg, prompts, num_slots=1, **kw)
    np.testing.assert_array_equal(wide.tokens, one.tokens)
    np.testing.assert_array_equal(wide.mask, one.mask)


def test_engine_refuses_bad_arguments(tiny_model):
    cfg, params = tiny_model
    kw = dict(key=jax.random.PRNGKey(0), max_new_tokens=2)
    for bad, match in [(dict(prompts=[], stop_ids=[2], num_slots=1), "prompts"),
                       (dict(prompts=[[5], []], stop_ids=[2], num_slots=1), "prompts"),
                       (dict(prompts=[[5]], stop_ids=[], num_slots=1), "stop_ids"),
                       (dict(prompts=[[5]], stop_ids=[2], num_slots=0), "num_slots"),
                       (dict(prompts=[[5], [6]], stop_ids=[2], num_slots=1, row_ids=[0]),
                        "row_ids")]:
        with pytest.raises(ValueError, match=match):
            sampling.generate_engine(params, cfg, **bad, **kw)


@pytest.mark.slow
def test_engine_on_a_mesh_gives_the_one_device_rows(tiny_model, monkeypatch):
    """On a 2 x 2 x 2 mesh of fake devices (slots and the pool's pages over data x fsdp =
    4, KV heads over tensor) the engine writes the one-device engine's rows, and its cache
    keeps that layout through inserts and steps (no gather of the cache into one
    device)."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    from drubric_jax import models, parallel

    cfg, params = tiny_model
    mesh = parallel.make_mesh(2, 2, 2)
    prompts = _prompts(cfg, lengths=(4, 19, 9, 30, 2), seed=3)
    kw = dict(key=jax.random.PRNGKey(9), max_new_tokens=6, method=sampling.Temperature(1.0),
              stop_ids=[2], num_slots=4)
    one = sampling.generate_engine(params, cfg, prompts, **kw)
    sharded = jax.device_put(params, models.param_shardings(params, mesh))
    seen = []
    real_insert = engine.insert

    def insert(state, *a):
        seen.append((state.cache.tables.sharding, state.cache.k[0].sharding))
        return real_insert(state, *a)

    monkeypatch.setattr(engine, "insert", insert)
    got = sampling.generate_engine(sharded, cfg, prompts, mesh=mesh, **kw)
    np.testing.assert_array_equal(got.tokens, one.tokens)
    np.testing.assert_array_equal(got.mask, one.mask)
    np.testing.assert_allclose(got.logprobs, one.logprobs, rtol=0,
                               atol=logprob_atol(one.logprobs, cfg.vocab_size))
    rows = parallel.batch_sharding(mesh)
    pages = NamedSharding(mesh, P("tensor", parallel.BATCH_AXES))
    assert len(seen) == len(prompts)
    assert all(t.is_equivalent_to(rows, 2) and k.is_equivalent_to(pages, 4)
               for t, k in seen), seen
    with pytest.raises(ValueError, match="multiple"):
        sampling.generate_engine(sharded, cfg, prompts, mesh=mesh, **dict(kw, num_slots=3))


@pytest.mark.slow
@pytest.mark.real_model
def test_bench_engine_prints_both_samplers_and_their_ratio(smollm2_gguf):
    """`experiments.bench_engine` at a toy size: one JSON line per sampler with its useful
    tokens/s, and their paired ratio; the same row ids give both the same tokens."""
    import json

    from helpers import run_module

    out = run_module("experiments.bench_engine", "--prompts=2", "--k=2", "--slots=2",
                     "--new_tokens=6", "--reps=1", timeout=600)
    rows = {r["impl"]: r for r in map(json.loads, out.splitlines()) if "impl" in r}
    for name in ("engine", "static"):
        r = rows[name]
        assert r["rows"] == 4 and 0 < r["useful_tokens"] <= 4 * 6 and r["useful_tok_s"] > 0
    assert rows["engine"]["prefills"] == 2 and rows["static"]["prefills"] == 4
    assert rows["engine"]["useful_tokens"] == rows["static"]["useful_tokens"]
    ratio = rows["engine_vs_static"]
    assert ratio["same_tokens"] == 1.0 and len(ratio["speedup_per_round"]) == 1
    # uniform: no stop id, every row runs to N in both samplers.
    out = run_module("experiments.bench_engine", "--prompts=2", "--k=2", "--slots=2",
                     "--new_tokens=4", "--reps=1", "--lengths=uniform", timeout=600)
    rows = {r["impl"]: r for r in map(json.loads, out.splitlines()) if "impl" in r}
    for name in ("engine", "static"):
        assert rows[name]["useful_tokens"] == 4 * 4 and rows[name]["length_mode"] == "uniform"
    assert rows["engine"]["steps"] == rows["static"]["steps"] == 2 * 4


def test_engine_in_the_stacked_cache_form(tiny_model):
    """The accelerators' form (`ModelConfig.decode_form = "stacked"`: stacked [L, ...]
    weights and cache, as on TPU) gives the rows of the per-layer form used on CPU and
    GPU; the form is the config's, not a global."""
    cfg, params = tiny_model
    prompts = _prompts(cfg, lengths=(5, 18, 2), seed=5)
    kw = dict(key=jax.random.PRNGKey(3), max_new_tokens=5, method=sampling.Temperature(1.0),
              stop_ids=[2], num_slots=2)
    per_layer = sampling.generate_engine(params, cfg, prompts, **kw)
    stacked = sampling.generate_engine(params, cfg.replace(decode_form="stacked"), prompts,
                                       **kw)
    # The stacked engine's state: [L, Hkv, Np, Ps, Dh] pools, not a tuple per layer.
    plan = engine.PagePlan(slots=2, shards=1, page_size=16, max_new_tokens=5, max_prompt=32,
                           prefix_pages=4)
    state = jax.eval_shape(lambda: engine.init_state(
        cfg.replace(decode_form="stacked"), plan, 3, 5, jax.random.PRNGKey(0)))
    assert not isinstance(state.cache.k, tuple) and state.cache.k.ndim == 5
    np.testing.assert_array_equal(stacked.tokens, per_layer.tokens)
    np.testing.assert_allclose(stacked.logprobs, per_layer.logprobs, rtol=0,
                               atol=logprob_atol(per_layer.logprobs, cfg.vocab_size))
