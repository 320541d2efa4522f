"""Sampling: how a token is drawn (`methods`), prompt buckets and padding (`buckets`), the
jitted decode primitives on a KV cache (`decode`), JSON-schema constrained decoding
(`constrained`), `generate` on top of both (`generate`), and the rollout engine
(`engine`: continuous batching over decode slots, one prefill per prompt; its host loop
`engine_host`).

Layers inside the package: methods, buckets, lengths < decode < constrained < generate,
engine < engine_host. The public names are exported here (`sampling.generate`,
`sampling.Greedy()`, ...); modules inside the package import each other's modules, never
this file.
"""
from drubric_jax.sampling.buckets import (BUCKET_POW2_UNTIL, BUCKET_STEP, bucket_length,
                                          cache_schedule, left_pad, mean_slots_read)
from drubric_jax.sampling.decode import (SamplerState, decode_loop, decode_params,
                                         decode_segments, forward_token, layer_copy, prefill,
                                         sample_token)
from drubric_jax.sampling.engine_host import (SAMPLERS, check_sampler, engine_slots,
                                              generate_constrained, generate_engine)
from drubric_jax.sampling.generate import generate, generate_chunked
from drubric_jax.sampling.methods import (Greedy, Method, Temperature, TopK, TopP,
                                          method_from_flags, sample_logits,
                                          scoring_temperature, temperature_for_scoring,
                                          truncated_logits)
