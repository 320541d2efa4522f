r"""Paper-scale run: Qwen3-8B policy and generator, for GPU/TPU hosts and pods.

    python -m experiments.run --config=configs/qwen3_8b.py \
        --config.model.policy=/ckpt/Qwen3-8B --config.model.generator=/ckpt/Qwen3-8B \
        --config.model.verifier=/ckpt/Qwen3-30B-A3B --workdir=gs://bucket/run
    python -m experiments.run --config=configs/qwen3_8b.py:lora ...      # one accelerator
    python -m experiments.run --config=configs/qwen3_8b.py:local --workdir=runs/q3local

Switches after ':':
    (none)   full fine-tuning, float32 masters and bfloat16 compute, the idle trainee's
             AdamW moments offloaded to pinned host memory between phases; parameters and
             moments split over mesh.fsdp = 8 (8 x 80 GB accelerators)
    lora     LoRA (Hu et al. 2021) rank 64 (`lora=R` for another rank), alpha = 2 r, on all
             seven matrices of every layer, over one frozen bfloat16 base that both
             references share; the mesh takes every device on fsdp (one 141 GB H200 holds
             the three roles, the 61 GB verifier included). The learning rates stay the
             paper's full fine-tuning ones; LoRA usually wants larger ones.
    local    every paper setting that does not depend on size (K, G, beta, lambda, learning
             rates, variants) but tiny random-weight Qwen3-architecture models (q/k-norm,
             untied head; the verifier a tiny Qwen3 mixture of experts) on the packaged
             demo data with CPU-size lengths: a smoke run of this config's code path on a
             laptop in a couple of minutes.
Memory: `python -m experiments.plan --config=configs/qwen3_8b.py:lora --devices=1
--device_memory_gb=141 --attention=blockwise` (docs/SCALE.md, "Memory plan") prints what each
device holds per step of a round and the rollout and update micro-batches that fit; the
update micro-batches set here are the ones it picks.

Settings from the paper (METHOD sections 4 and 10): K = 8, beta = 0.01, learning rate
5e-6 (generator) and 1e-6 (policy), global batch 256 responses, lengths 8K/8K (policy)
and 24K/8K (generator). The model paths are Hugging Face directories (config.json +
safetensors); on a multi-host pod start one process per host (jax.distributed).
Verifier: the paper's, Qwen3-30B-A3B (a mixture of 128 experts, 8 per token;
`models.qwen3_moe`), 61 GB in bfloat16, its own frozen weights. `--config.model.verifier=
Qwen/Qwen3-8B` (or its directory) makes the verifier the policy's backbone instead, which
then shares the one frozen base with both references.
"""
from configs.base import base_config, parse_switches


def get_config(arg: str = ""):
    opts = parse_switches(arg, {"local", "lora"})
    c = base_config()
    c.model.policy = "Qwen/Qwen3-8B"
    c.model.generator = "Qwen/Qwen3-8B"
    c.model.verifier = "Qwen/Qwen3-30B-A3B"  # the paper's verifier (mixture of experts)
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
    c.memory.offload_idle_optimizer = True  # the idle trainee's moments: pinned host memory
    # Rollout micro-batches and several hosts: each row draws by its global row id, so the
    # samples are the same whatever the micro-batch sizes or the host count.
    c.per_row_keys = True
    c.checkpoint.every_steps = 20
    c.checkpoint.max_to_keep = 3
    # Updates per row, not in groups sharing a prefix (`train.shared_prefix`): a device's
    # gradient pass holds at least one whole group, P + R N = 73,728 policy or 90,112
    # generator tokens, and its recomputed layer alone is 46.5 / 56.8 GB; the planner puts
    # the grouped generator update's peak at 122.8 GB a device (full fine-tuning, fsdp 8)
    # and 166.8 GB on the one LoRA device. Grouped fits 8 x 141 GB (full fine-tuning):
    # --config.policy.train.shared_prefix=True --config.generator.train.shared_prefix=True
    # there (docs/SCALE.md, "Time of a round": 147 s against 351 s a generator update).
    c.policy.train.shared_prefix = c.generator.train.shared_prefix = False
    if opts.get("lora"):
        c.lora.rank = 64 if opts["lora"] is True else int(opts["lora"])
        c.lora.alpha = 2.0 * c.lora.rank
        c.mesh.data, c.mesh.fsdp = 1, -1
        # The planner's picks on one 141 GB device beside the 61 GB verifier: 2 policy rows
        # and 1 rubric list per gradient pass. Adapters and their moments are small: no
        # offload.
        c.policy.train.micro_batch_size = 2
        c.generator.train.micro_batch_size = 1
        # And per sampler call (the KV cache): 8 responses (4 before the policy's decode
        # ran in cache segments, `sampling.cache_schedule`), 2 rubric lists.
        c.policy.rollout_micro_batch, c.generator.rollout_micro_batch = 8, 2
        c.memory.offload_idle_optimizer = False
    else:
        # The planner's picks for full fine-tuning on 8 x 80 GB GPUs (mesh 1 x 8 x 1): per
        # sampler call 32 responses and 8 rubric lists (4 and 1 a device: each device decodes
        # its rows on a whole bfloat16 rollout copy, 16.4 GB; the policy's cache grows in
        # segments, `sampling.cache_schedule`), 16 policy rows per gradient pass. With
        # --config.mesh.fsdp=4 --config.mesh.tensor=2 the copy is split in two and the
        # planner picks 64 and 16 per call (4 and 8 per update).
        c.policy.rollout_micro_batch, c.generator.rollout_micro_batch = 32, 8
        c.policy.train.micro_batch_size = 16
    if opts.get("local"):
        c.model.policy = c.model.generator = "tiny_qwen3"
        c.model.verifier = "tiny_qwen3_moe"
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
        # Tiny models at CPU lengths: a whole group fits, the shared prefix runs once.
        c.policy.train.shared_prefix = c.generator.train.shared_prefix = True
        c.mesh.data, c.mesh.fsdp = -1, 1
        c.memory.offload_idle_optimizer = False
        c.checkpoint.every_steps = 1
        c.export = False
    return c


def get_sweep(hyper=None):
    """The paper's generator-objective ablation (Table 3, METHOD section 6)."""
    del hyper
    return [{"config.variant": v} for v in ("full", "disc_only", "anchor_only")]
