r"""The generator's supervised warm start G_sft (checks world III; `rounds.sft_stage`).

    python -m experiments.sft_generator --config=configs/sft_generator.py --workdir=runs/g_sft
    python -m experiments.sft_generator --config=configs/sft_generator.py:tiny,checks_dir=DIR --workdir=/tmp/s

A deviation for scale, not the paper's method: it stands in for the zero-shot competence of
the paper's 8B generator (docs/CHECKS_WORLD.md, "World III"). The generator is the checks
world's (`configs/checks_world.py`, world v2): its prompt lists the pool's checks, it sees
K = 8 of P_0's responses, its output is constrained to the pool's JSON schema. Pairs come
from the gen_sft split's anchor rows (gen_sft_anchors.jsonl: K = 8 samples of P_0 per
gen_sft prompt, prompts no other stage reads); its recovery after each epoch, where its
recipe is chosen, is measured on the dev split's (dev_anchors.jsonl). A row of another
split in either file stops the stage (`rounds.sft_stage`, `data.splits`). The commands that
build every file are `configs.checks_world.build_commands`.

Switches after ':': tiny (a random-weight generator, 2 pairs, for tests), checks_dir=DIR,
world_version=2 (the only one with a generator check pool).
"""
from configs.base import checks_experiment_base
from configs.checks_world import world_files


def get_config(arg: str = ""):
    c, opts, _ = checks_experiment_base(arg, "configs/sft_generator.py")
    if c.data.checks_world_version != 2:
        raise ValueError("configs/sft_generator.py needs world_version=2 (the generator's "
                         "check pool)")
    files = world_files(2, c.data.checks_dir)
    c.sft = dict(
        train_anchors=files["sft_anchors"],  # the gen_sft split's anchor rows (the pairs)
        heldout_prompts=files["heldout"],    # the reported held-out prompts: never paired
        eval_anchors=files["dev_anchors"],   # the dev split's: recovery after each epoch
        # Anchor rows paired, the first of the file (0 = all). 192 prompts x 1 epoch reached
        # held-out F1 0.53; 64 x 2 stopped at 0.25 (results/checks_world_v3).
        train_rows=192,
        pairs_per_prompt=1,    # pairs per training prompt, each with its own response order
        epochs=1,              # passes over the pairs; dev recovery after each
        batch=1,               # pairs per update
        learning_rate=1e-3,    # AdamW peak step of the rank-16 adapters
        warmup_steps=8,        # updates of linear warm-up
        max_grad_norm=1.0,     # global-norm clip
        logits_chunk=128,      # tokens per output-head chunk
        remat=False,           # one pair of <= 1,600 tokens: activations fit without recompute
        checkpoint_every=16,   # updates between checkpoints (and at each epoch's end)
        eval_rows=32,          # dev rows whose lists are scored (0 = all)
        eval_temperature=0.0,  # list decoding at evaluation: 0 = greedy
        eval_batch=8,          # dev rows decoded together
        n_bootstrap=1000,      # replicates of every 95% CI (dev rows resampled)
    )
    if opts.get("tiny"):
        c.sft.train_rows, c.sft.eval_rows, c.sft.epochs = 2, 2, 1
        c.sft.warmup_steps, c.sft.checkpoint_every, c.sft.n_bootstrap = 0, 1, 50
        c.sft.eval_batch = 2
    return c
