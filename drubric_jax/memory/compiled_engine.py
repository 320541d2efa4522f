"""The rollout engine's compiled peaks (`engine_peaks`), for `memory.compiled`'s measured
column: the engine's own programs (`sampling.engine`) lowered and analysed on a mesh."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from drubric_jax import models, parallel, sampling
from drubric_jax.memory.compiled_base import (_NoCopy, _row_structs, _structs, analyse,
                                              device_bytes, rollout_copy)
from drubric_jax.models.config import ModelConfig
from drubric_jax.sampling import constrained as constrained_lib


def engine_peaks(cfg: ModelConfig, params, slots: int, rows: int, prompt: int, new: int,
                 constrained: bool, mesh, rows_per_prompt: int = 1) -> tuple:
    """Bytes per device beyond `params` at each peak of the rollout engine
    (`engine_host.generate_engine(..., mesh=mesh)`), E = `slots` slots, B = `rows` rows of
    K = `rows_per_prompt` a prompt (`inference_terms.engine_pages`), prompt bucket P and
    N = `new`, on the rollout copy of `params`: (one prompt's prefill, its prefix store or
    an insert, a decode call reading the whole table or, `constrained`, the larger of
    `sample_step` and `forward_step`), each beside the copy, the engine's state and (after
    the prefill) the prompt store."""
    from jax.sharding import NamedSharding, PartitionSpec

    from drubric_jax.memory.inference_terms import engine_pages
    from drubric_jax.models import paged
    from drubric_jax.sampling import engine

    params, copy = rollout_copy(params, cfg, mesh)
    held = 0 if copy is None else copy.output
    if models.is_per_layer(params) or not models.decode_per_layer(cfg):
        layers, loop_params = _NoCopy(), params
    else:
        layers = analyse(sampling.layer_copy.lower(params["layers"], cfg))
        loop_params = {**params, "layers": layers.outputs}
    shards = parallel.row_shards(mesh)
    plan = engine_pages(slots, shards, rows, prompt, new, rows_per_prompt)
    every = NamedSharding(mesh, PartitionSpec())

    def ints(*shape, dtype=jnp.int32):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=every)

    with parallel.rows_on(mesh):
        state = jax.eval_shape(lambda: engine.init_state(
            cfg, plan, rows, new, jax.random.PRNGKey(0),
            per_layer=models.is_per_layer(loop_params)))
        state = _structs(state, engine.state_shardings(state, cfg, mesh))
        # The prefill runs on the copy as the host loop passes it (stacked or per-layer).
        pre = analyse(engine.prefill_prompt.lower(params, cfg, ints(1, prompt),
                                                  ints(1, prompt, dtype=bool), plan.page_size))
        pp = paged.pages_for(prompt, plan.page_size)
        store = analyse(engine.store_prefix.lower(state, pre.outputs, ints(shards, pp)))
        ins = analyse(engine.insert.lower(state, ints(), ints(plan.table_pages), ints(),
                                          ints(shards, 2), pre.outputs.logits, ints(), ints()))
        base = held + layers.output + device_bytes(state)
        method = sampling.Temperature(1.0)
        if not constrained:
            step = analyse(engine.decode_steps.lower(
                loop_params, cfg, state, method, ints(1), 0, 64, ints(dtype=bool),
                plan.table_pages)).extra
        else:
            words, = _row_structs(mesh, slots, ((constrained_lib.bitmask_words(
                cfg.vocab_size),), jnp.int32))
            force, = _row_structs(mesh, slots, ((), bool))
            sample = analyse(engine.sample_step.lower(state, words, force, method, ints(1), 0))
            new_state, tok, emitted, _ = sample.outputs
            forward = analyse(engine.forward_step.lower(loop_params, cfg, new_state, tok,
                                                        emitted, plan.table_pages))
            step = max(sample.extra + device_bytes(words) + device_bytes(force),
                       forward.extra)
    return (base + pre.extra, base + pre.output + max(store.extra, ins.extra),
            base + pre.output + step)
