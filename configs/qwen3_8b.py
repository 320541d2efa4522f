r"""Paper-scale run: Qwen3-8B policy and generator, for GPU/TPU pods.

    python -m experiments.run --config=configs/qwen3_8b.py \
        --config.model.policy=/ckpt/Qwen3-8B --config.model.generator=/ckpt/Qwen3-8B \
        --config.model.verifier=/ckpt/Qwen3-30B-A3B --workdir=gs://bucket/run
    python -m experiments.run --config=configs/qwen3_8b.py:local --workdir=runs/q3local

Switches after ':': `local` keeps every paper setting that does not depend on size (K, G,
beta, lambda, learning rates, variants) but runs a tiny random-weight Qwen3-architecture
model (q/k-norm, untied head) on the packaged demo data with CPU-size lengths: a smoke run
of this config's code path on a laptop in a couple of minutes.

Settings from the paper (METHOD sections 4 and 10): K = 8, beta = 0.01, learning rate
5e-6 (generator) and 1e-6 (policy), global batch 256 responses, lengths 8K/8K (policy)
and 24K/8K (generator). The model paths are Hugging Face directories (config.json +
safetensors); on a multi-host pod start one process per host (jax.distributed).
Note: the paper's verifier, Qwen3-30B-A3B, is a mixture-of-experts model that
drubric_jax's decoder does not implement; a dense Qwen3/Llama verifier works.
"""
from configs.base import base_config, parse_switches


def get_config(arg: str = ""):
    opts = parse_switches(arg, {"local"})
    c = base_config()
    c.model.policy = "Qwen/Qwen3-8B"
    c.model.generator = "Qwen/Qwen3-8B"
    c.model.verifier = "Qwen/Qwen3-8B"
    c.model.dtype = "bfloat16"
    c.data.name = "custom"
    c.data.anchor_paths = ("hf:berkeley-nest/Nectar",)
    c.data.prompt_paths = ("hf:berkeley-nest/Nectar",)
    c.data.min_responses = 7
    c.data.min_prompt_chars = 50
    c.data.min_top_response_chars = 50
    c.data.heldout_anchor_rows = 256
    c.rounds.num_rounds = 3
    c.rounds.generator_steps = 100
    c.rounds.policy_steps = 200
    c.policy.prompts_per_step = 32          # 32 prompts x K=8 = 256 responses per step
    c.policy.num_responses = 8              # K
    c.policy.max_prompt_tokens = 8192
    c.policy.max_new_tokens = 8192
    c.policy.train.learning_rate = 1e-6
    c.policy.train.beta = 0.01
    c.policy.train.micro_batch_size = 8
    c.generator.anchors_per_step = 32       # 32 x G=8 = 256 rubric lists per step
    c.generator.num_lists = 8               # G
    c.generator.max_items = 20
    c.generator.max_item_chars = 300
    c.generator.max_new_tokens = 8192
    c.generator.input_budget = 24576
    c.generator.train.learning_rate = 5e-6
    c.generator.train.beta = 0.01
    c.generator.train.micro_batch_size = 8
    c.verifier.verdict = "hard"  # the paper's 0/1 verdicts (a 30B verifier separates items)
    c.verifier.max_prefix_tokens = 16384
    c.verifier.max_suffix_tokens = 256
    c.mesh.data = -1
    c.mesh.fsdp = 8
    c.mesh.tensor = 1
    c.checkpoint.every_steps = 20
    c.checkpoint.max_to_keep = 3
    if opts.get("local"):
        c.model.policy = c.model.generator = c.model.verifier = "tiny_qwen3"
        c.model.dtype = "float32"
        c.data.name = "demo"
        c.data.min_responses, c.data.min_prompt_chars, c.data.min_top_response_chars = 2, 0, 0
        c.data.heldout_anchor_rows = 2
        c.rounds.num_rounds, c.rounds.generator_steps, c.rounds.policy_steps = 1, 1, 1
        c.policy.prompts_per_step, c.generator.anchors_per_step = 1, 1
        c.policy.max_prompt_tokens, c.policy.max_new_tokens = 128, 16
        c.generator.max_items, c.generator.max_item_chars = 3, 40
        c.generator.max_new_tokens, c.generator.input_budget = 96, 1024
        c.verifier.max_prefix_tokens, c.verifier.max_suffix_tokens = 512, 32
        c.policy.train.micro_batch_size = c.generator.train.micro_batch_size = 0
        c.mesh.fsdp = 1
        c.checkpoint.every_steps = 1
        c.export = False
    return c


def get_sweep(hyper=None):
    """The paper's generator-objective ablation (Table 3, METHOD section 6)."""
    del hyper
    return [{"config.variant": v} for v in ("full", "disc_only", "anchor_only")]
