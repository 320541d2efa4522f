"""Chat with a model from the command line: one user turn, the answer on stdout.

    python -m experiments.sample --prompt "What is the capital of France?"
    python -m experiments.sample --prompt "Write a haiku." --temperature=0.8 --top_p=0.95
    python -m experiments.sample --model=/path/model.gguf --system "Answer briefly." --prompt "Hi"

The prompt is rendered by the model's own chat template (`tokenizer.chat_ids`) and decoded
by `sampling.generate` until an end-of-turn token or `--max_new_tokens`.
"""
from __future__ import annotations

import os

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from absl import flags, logging  # noqa: E402
from experiments import cli  # noqa: E402

_PROMPT = flags.DEFINE_string("prompt", None, "user message", required=True)
_SYSTEM = flags.DEFINE_string("system", None, "optional system message (else the template's)")
_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct",
                             "'smollm2-135m-instruct', a .gguf path or a Hugging Face directory")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "sampling temperature; 0 = greedy")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "nucleus mass in (0, 1]; 1 = off")
_TOP_K = flags.DEFINE_integer("top_k", 0, "keep the k largest logits; 0 = off")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 256, "longest answer, in tokens")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed of the sampler")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "params/compute dtype")


def respond(cfg, params, tokenizer, messages, *, method, max_new_tokens: int, seed: int) -> str:
    """The model's reply to chat `messages` (list of {"role", "content"} dicts), as text."""
    import jax

    from drubric_jax import sampling
    from drubric_jax.text import tokenizer as tok_lib

    ids = tok_lib.chat_ids(tokenizer, messages)
    out = sampling.generate(params, cfg, [ids], key=jax.random.PRNGKey(seed),
                            max_new_tokens=max_new_tokens, method=method,
                            stop_ids=tok_lib.stop_ids(tokenizer))
    if out.truncated[0]:
        logging.warning("answer cut at --max_new_tokens=%d", max_new_tokens)
    return tokenizer.decode(out.tokens[0][out.mask[0]], skip_special_tokens=True)


def main(argv):
    del argv
    import jax

    from drubric_jax import models, sampling

    logging.info("devices: %s", jax.devices())
    method = sampling.method_from_flags(_TEMPERATURE.value, _TOP_K.value, _TOP_P.value)
    cfg, params, tokenizer = models.load_model(_MODEL.value, _DTYPE.value)
    messages = ([{"role": "system", "content": _SYSTEM.value}] if _SYSTEM.value else [])
    messages.append({"role": "user", "content": _PROMPT.value})
    print(respond(cfg, params, tokenizer, messages, method=method,
                  max_new_tokens=_MAX_NEW_TOKENS.value, seed=_SEED.value), flush=True)


if __name__ == "__main__":
    cli.run(main)
