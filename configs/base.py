"""Every field of a co-evolution run, with its unit and paper symbol.

Configs under configs/ start from `base_config()` and override what they change.
`drubric_jax.config_check.validate(config)` checks the combination before any compute.
"""
import ml_collections


def parse_switches(arg: str, allowed) -> dict:
    """The ':'-argument of a config file: "a=1,b" -> {"a": "1", "b": True}.

    Raises:
        ValueError: a switch not in `allowed`.
    """
    out = {}
    for part in filter(None, (arg or "").split(",")):
        key, _, value = part.partition("=")
        out[key.strip()] = value.strip() or True
    unknown = set(out) - set(allowed)
    if unknown:
        raise ValueError(f"unknown config switches {sorted(unknown)} in {arg!r}")
    return out


EXPERIMENT_SCALES = ("smollm2_cpu", "qwen3_8b")


def experiment_base(arg: str, cpu_data: str = "demo"):
    """(run config, switches, scale) of an experiment config (configs/grpo_learns.py,
    ablation.py, coevolution.py): the switches `scale=smollm2_cpu|qwen3_8b` (the base
    config, configs/<scale>.py), `tiny` (its tiny-model switch: `tiny` or `local`) and
    `world=llm|checks` (checks: `configs.checks_world.checks_world`, the checkable-item
    world of METHOD 13, at either scale; `checks_dir=DIR` its files); `cpu_data` is the
    smollm2_cpu data switch (demo | shared) when not tiny.

    Raises:
        ValueError: an unknown switch or scale.
    """
    import importlib

    opts = parse_switches(arg, {"scale", "tiny", "world", "checks_dir", "world_version"})
    scale = opts.get("scale", "smollm2_cpu")
    if scale not in EXPERIMENT_SCALES:
        raise ValueError(f"scale={scale!r} not in {EXPERIMENT_SCALES}")
    base = importlib.import_module(f"configs.{scale}")
    if scale == "smollm2_cpu":
        c = base.get_config("tiny" if opts.get("tiny") else f"data={cpu_data}")
    else:
        c = base.get_config("local" if opts.get("tiny") else "")
    if opts.get("world", "llm") not in ("llm", "checks"):
        raise ValueError(f"world={opts['world']!r} not in ('llm', 'checks')")
    if opts.get("world") == "checks":
        from configs.checks_world import DEFAULT_WORLD_VERSION, checks_world
        checks_world(c, opts.get("checks_dir", ""),
                     int(opts.get("world_version", DEFAULT_WORLD_VERSION)))
    return c, opts, scale


def checks_experiment_base(arg: str, config_name: str):
    """`experiment_base` of an experiment that runs in the checks world only (METHOD 13):
    `world=checks` is added to the switches when absent.

    Raises:
        ValueError: another world asked for (names `config_name`), or as `experiment_base`.
    """
    if "world=" not in (arg or ""):
        arg = ",".join(filter(None, [arg, "world=checks"]))
    c, opts, scale = experiment_base(arg, "demo")
    if opts.get("world") != "checks":
        raise ValueError(f"{config_name} runs in the checks world only (world=checks)")
    return c, opts, scale


def trainer_config(learning_rate: float) -> ml_collections.ConfigDict:
    """GRPO optimiser and loss settings for one trainable role (METHOD section 4).

    The fields and their defaults are `drubric_jax.rl.train_config.TrainConfig`'s (one
    source; its field comments give units and paper symbols), less `temperature` (the
    sampler's, set by the run) and with `micro_batch_size` 0: responses per
    gradient-accumulation chunk, 0 = the whole batch of a step.
    """
    import dataclasses

    from drubric_jax.rl.train_config import TrainConfig

    c = ml_collections.ConfigDict({f.name: f.default for f in dataclasses.fields(TrainConfig)
                                   if f.name != "temperature"})
    c.learning_rate = learning_rate  # AdamW peak learning rate
    c.micro_batch_size = 0           # responses per gradient-accumulation chunk; 0 = whole batch
    # True | False | "auto": recompute each layer in the backward pass; "auto" only where the
    # update's saved activations would not fit the device memory (the run decides and logs
    # it, `memory.remat.resolve_remat`; `experiments.plan` prints the decision). A field
    # of any type, so both `c.policy.train.remat = False` and `--config.policy.train.remat=
    # False` (parsed as the bool) set it.
    c.remat = ml_collections.FieldReference("auto", field_type=object)
    return c


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0  # every random choice derives from this through jax.random keys
    # Sampling draws. False: a row's random numbers depend on its position in its sampler
    # call (the runs in results/ drew this way). True: each row draws from its id in the
    # step's global batch, so the samples do not change with the rollout micro-batches or
    # the number of hosts (row for row).
    c.per_row_keys = False

    c.model = ml_collections.ConfigDict()
    c.model.policy = "smollm2-135m-instruct"     # policy P_0: preset name, .gguf path or HF dir
    c.model.generator = "smollm2-135m-instruct"  # rubric generator G_0
    c.model.verifier = "smollm2-135m-instruct"   # frozen verifier
    c.model.dtype = "float32"          # compute and frozen-weight storage: float32 | bfloat16
    c.model.master_dtype = "float32"   # trained params (masters / adapters): float32 | bfloat16

    c.data = ml_collections.ConfigDict()
    c.data.name = "demo"            # "demo" (packaged demo set) | "shared" (../shared/data) | "custom"
    c.data.shared_dir = ""          # root of the shared data; "" = ../shared next to the repo
    # The checks world's directory (METHOD 13; configs/checks_world.py names its files), read
    # by the `world=checks` switch of configs/smollm2_cpu.py when it builds the paths ("" =
    # $DRUBRIC_CHECKS_DIR, else ../checks_world_v2_splits next to the repo); recorded here.
    c.data.checks_dir = ""
    c.data.checks_world_version = 0  # 1 | 2 in the checks world (configs/smollm2_cpu.py); 0 = none
    # Every stage reads its own split (world v2's five disjoint splits, `data.splits`; issue
    # 53): prompt_paths rows must be the "policy" split, anchor_paths "gen_rl",
    # heldout_anchor_paths "heldout" (meta.split), else the run stops naming the row.
    c.data.require_splits = False
    c.data.checks_build = ""         # the commands that write the checks world's files
    # Refuse a prompt row whose constraints a role's input budget would cut (world v2,
    # `checks.fit`): the policy's prompt budget, the generator's input with K responses.
    c.data.refuse_cut_constraints = False
    # Entries: JSONL paths, "hf:<dataset id>" (Nectar, network) or "tfds:NAME[:SPLIT]" (a TFDS
    # split in tfds_data_dir, built by experiments/build_tfds.py; docs/CONFIGS.md, "TFDS").
    c.data.anchor_paths = ()        # JSONL anchor lists (ranked), used when name == "custom"
    c.data.prompt_paths = ()        # JSONL prompts for the policy phase, name == "custom"
    c.data.tfds_data_dir = ""       # TFDS data_dir of "tfds:" entries ("" = TFDS's default)
    c.data.max_anchor_rows = 0      # cap on anchor rows read (0 = all)
    c.data.max_prompt_rows = 0      # cap on prompt rows read (0 = all)
    c.data.heldout_anchor_rows = 4  # anchor lists held out for Delta_gap (Eq. 2)
    # Files the held-out lists come from instead (their seeded shuffle's first
    # heldout_anchor_rows); then every list of anchor_paths trains. A held-out list with a
    # training list's prompt is refused. () = split anchor_paths.
    c.data.heldout_anchor_paths = ()
    c.data.min_responses = 2        # anchor filter: responses per list (Nectar setting: 7)
    c.data.max_responses = 7        # anchor lists longer than this are cut (lowest ranks dropped)
    c.data.min_prompt_chars = 0     # Appendix B filter (paper: 50)
    c.data.min_top_response_chars = 0  # Appendix B filter (paper: 50)

    c.rounds = ml_collections.ConfigDict()
    c.rounds.num_rounds = 2         # T, co-evolution rounds (Algorithm 1)
    c.rounds.generator_steps = 2    # generator GRPO steps per round
    c.rounds.policy_steps = 2       # policy GRPO steps per round
    c.variant = "full"              # full | disc_only | anchor_only | static (METHOD section 6)
    # Delta_gap / R_anchor on the held-out anchor lists before each round's generator phase
    # and after its policy phase; experiments that score the held-out lists themselves
    # (experiments/ablation.py) turn it off.
    c.rounds.heldout_eval = True
    # Rounds whose generator phase trains: the first `generator_rounds` (-1 = every round).
    # 1 keeps G_1 from round 1 on: the stale-evaluator arm of experiments/coevolution.py.
    c.rounds.generator_rounds = -1
    # The known-answer curve (checks world, `rounds.gold_curve`): every N policy steps (and
    # before the first) the policy answers the first `heldout_gold_rows` prompts of
    # `heldout_gold_path` greedy and once at its temperature; 0 = off, rows 0 = all.
    c.rounds.heldout_gold_every = 0
    c.rounds.heldout_gold_rows = 0
    c.rounds.heldout_gold_path = ""
    # The split the gold curve's rows must be when data.require_splits ("dev" while settings
    # are chosen from the curve, "heldout" where it is the reported result; "" = any).
    c.rounds.heldout_gold_split = ""

    c.policy = ml_collections.ConfigDict()
    c.policy.prompts_per_step = 2   # prompts x per policy step
    c.policy.num_responses = 4      # K, responses per prompt (paper: 8)
    c.policy.max_prompt_tokens = 128   # prompt budget, tokens (paper: 8K)
    c.policy.max_new_tokens = 64       # response budget, tokens (paper: 8K)
    c.policy.min_prompt_bucket = 16    # smallest prompt-length bucket (powers of two), tokens
    c.policy.temperature = 1.0      # sampling temperature (log-probs use the same)
    c.policy.top_p = 1.0            # nucleus mass; 1.0 = off
    c.policy.rubric_temperature = 0.0  # generator decoding when it scores the policy (0 = greedy)
    c.policy.heldout_temperature = 0.0  # generator decoding of the held-out evaluation lists
    c.policy.rollout_micro_batch = 0  # responses per sampler call (bounds the KV cache); 0 = all
    # "static": batches of rollout_micro_batch rows, each decoded to its longest row
    # (`sampling.generate_chunked`); "engine": rollout_micro_batch decode slots, a finished
    # row's slot taking the next row, one prefill per prompt (`sampling.generate_engine`;
    # under several processes each runs the same host loop over every row; cache_segments
    # does not apply).
    c.policy.sampler = "static"
    # Response lengths for `experiments.plan --time` only: quantiles "q:tokens,..." (e.g.
    # "0.1:300,0.5:1200,0.9:5000"); "" = every row runs to max_new_tokens.
    c.policy.response_lengths = ""
    # Decode segments of the KV cache (`sampling.cache_schedule`): the cache grows by chunks
    # so a step reads only the slots of its segment; 0 = auto (4 when max_new_tokens >= 4096
    # and >= half the prompt bucket, on CPU and GPU), 1 = one cache of P + N slots.
    c.policy.cache_segments = 0
    # The policy's reward: "rubric" (DynamicRubric, Eq. 12) or a rule for plain GRPO,
    # "word_limit" | "exact_match" (drubric_jax/rl/rule_rewards.py); N of word_limit, words.
    c.policy.reward = "rubric"
    c.policy.reward_max_words = 32
    # A policy step whose groups are all flat (every advantage 0, Eq. 21: nothing to learn)
    # draws fresh prompts, at most this many times; a step still all flat makes no update.
    c.policy.max_redraws = 2
    c.policy.train = trainer_config(1e-6)

    c.generator = ml_collections.ConfigDict()
    c.generator.anchors_per_step = 1   # anchor examples (x, C_anchor) per generator step
    c.generator.num_lists = 4          # G, rubric lists sampled per (x, C)
    # Weights of the generator rewards' advantages (Eq. 24-25, rl/generator_rewards.py: one
    # field per registered reward) in the full objective; the ablation variants override them.
    c.generator.disc_weight = 1.0      # weight of A_disc (Eq. 24-25; the paper: 1)
    c.generator.lam = 1.0              # lambda, weight of A_anchor (Eq. 17, 24-25)
    c.generator.max_items = 4          # M_max, items per rubric list (JSON schema bound)
    c.generator.max_item_chars = 100   # characters per item text (JSON schema bound)
    c.generator.max_new_tokens = 160   # generator output budget, tokens (paper: 8K)
    c.generator.input_budget = 896     # generator prompt budget, tokens (paper: 24K)
    c.generator.temperature = 1.0      # sampling temperature of rubric lists
    c.generator.rollout_micro_batch = 0  # rubric lists per sampler call; 0 = all
    c.generator.cache_segments = 0     # as policy.cache_segments
    c.generator.sampler = "static"     # as policy.sampler ("engine": one matcher per slot)
    c.generator.response_lengths = ""  # as policy.response_lengths
    # Checks world (verifier.kind = "checks"): the check ids the generator's prompt lists and
    # its JSON schema allows (world v2: the calibrated pool's ids); () = every scorable check.
    c.generator.check_pool = ()
    # The request is never cut to fit input_budget, only the responses (world v2: the
    # constraints a request ends with must reach the generator).
    c.generator.keep_prompt = False
    # False: an input's G lists show its K responses in one drawn order, one shared prompt
    # that the update runs once (train.shared_prefix); True: an order per list (the update
    # must then run per row: generator.train.shared_prefix = False).
    c.generator.orders_per_list = False
    c.generator.train = trainer_config(5e-6)

    c.verifier = ml_collections.ConfigDict()
    # What judges an item: "llm" (the frozen verifier model's P(yes), METHOD 11) or "checks"
    # (items are IFEval checks with arguments, the checker's 0/1 verdict, METHOD 13; no
    # verifier model is loaded and the generator writes checks).
    c.verifier.kind = "llm"
    c.verifier.loose = False        # checks: IFEval's loose verdict instead of the strict one
    c.verifier.check_workers = 0    # checks: process-pool size of the checkers (0 = CPU count)
    c.verifier.max_prefix_tokens = 384  # instructions + prompt + response budget, tokens
    c.verifier.max_suffix_tokens = 64   # rubric item question budget, tokens
    c.verifier.verdict = "hard"         # v of Eq. 12-13: hard 1[P(yes) > 0.5] | soft P(yes)
    c.verifier.calibration = "none"     # none | contextual (P(yes) vs the "N/A" response)
    # Share of an accelerator's memory the verifier's KV cache and prefill chunks may use
    # (its chunk budgets follow from it and the model); 0 or a CPU: fixed CPU budgets.
    c.verifier.memory_fraction = 0.25

    # LoRA (Hu et al. 2021): the trainees are low-rank adapters on one frozen base, which
    # is also their reference (adapter off) and, when it is the same model, the verifier.
    c.lora = ml_collections.ConfigDict()
    c.lora.rank = 0          # r of every adapter; 0 = full fine-tuning (no adapters)
    c.lora.alpha = 16.0      # scale alpha: W = W0 + (alpha / r) A B
    c.lora.targets = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")  # adapted matrices

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1    # data-parallel axis size (-1 = all remaining devices)
    c.mesh.fsdp = 1     # parameter-sharding axis size
    c.mesh.tensor = 1   # tensor-parallel axis size
    c.mesh.num_devices = 0  # devices the mesh uses (first N of jax.devices()); 0 = all

    c.memory = ml_collections.ConfigDict()
    # Write the AdamW moments of the role that is idle in a phase to workdir/parked/ and
    # map them back at its next phase (single process only; saves 2-3 params' worth of RAM).
    c.memory.park_idle_optimizer = False
    # Accelerators: the idle role's AdamW moments wait in pinned host memory (`jax.device_put`
    # to the "pinned_host" memory kind) during the other role's phase, and come back at its
    # next phase (saves 2-3 params' worth of device memory in full fine-tuning).
    c.memory.offload_idle_optimizer = False

    c.compile = ml_collections.ConfigDict()
    # JAX's persistent compilation cache ("" = off): a resumed run or the next process
    # loads compiled programs instead of compiling them again.
    c.compile.cache_dir = "~/.cache/drubric_jax/xla"

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every_steps = 1   # save after every N optimizer steps (either role)
    c.checkpoint.max_to_keep = 2
    # Resume even when the data's fingerprint (paths, rows, content hash) differs from the
    # checkpoint's; by default such a resume is refused.
    c.checkpoint.allow_data_change = False

    c.log = ml_collections.ConfigDict()
    c.log.trace_prompts = 2        # prompts shown in trace/round_N.html
    c.log.tensorboard = True
    c.log.progress = True          # tqdm bars per phase

    c.export = True  # write DIR/export/{policy,generator}/ Hugging Face directories at the end
    return c
