r"""The generator's supervised warm start G_sft (checks world III; `rounds.sft_stage`).

    python -m experiments.sft_generator --config=configs/sft_generator.py --workdir=runs/g_sft
    python -m experiments.sft_generator --config=configs/sft_generator.py:tiny,checks_dir=DIR --workdir=/tmp/s

A deviation for scale, not the paper's method: it stands in for the zero-shot competence of
the paper's 8B generator (docs/CHECKS_WORLD.md, "World III"). The generator is the checks
world's (`configs/checks_world.py`, world v2): its prompt lists the pool's checks, it sees
K = 8 of P_0's responses, its output is constrained to the pool's JSON schema. Pairs come
from the training prompts' anchor rows (anchors.jsonl: K = 8 samples of P_0 per training
prompt); held-out recovery is measured on heldout_anchors.jsonl (the same, on held-out
prompts; its build command is `HELDOUT_ANCHORS_BUILD`).

Switches after ':': tiny (a random-weight generator, 2 pairs, for tests), checks_dir=DIR,
world_version=2 (the only one with a generator check pool).
"""
import os

from configs.base import checks_experiment_base

HELDOUT_ANCHORS = "heldout_anchors.jsonl"


def heldout_anchors_build(directory: str) -> str:
    """The command that writes the held-out anchor rows (K = 8 samples of P_0 on the first
    64 held-out prompts, world v2's sampling settings), run from the repository root."""
    return (f".venv/bin/python -m experiments.make_checks_anchors "
            f"--prompts={directory}/heldout.jsonl --out={directory}/{HELDOUT_ANCHORS} --k=8 "
            "--temperature=1.0 --max_new_tokens=64 --limit=64")


def get_config(arg: str = ""):
    c, opts, _ = checks_experiment_base(arg, "configs/sft_generator.py")
    if c.data.checks_world_version != 2:
        raise ValueError("configs/sft_generator.py needs world_version=2 (the generator's "
                         "check pool)")
    d = c.data.checks_dir
    c.sft = dict(
        train_anchors=os.path.join(d, "anchors.jsonl"),    # training prompts x K responses
        heldout_prompts=os.path.join(d, "heldout.jsonl"),  # never paired (refused)
        heldout_anchors=os.path.join(d, HELDOUT_ANCHORS),  # held-out recovery is measured here
        heldout_anchors_build=heldout_anchors_build(d),
        # Anchor rows paired, the first of the file (0 = all). 192 prompts x 1 epoch reached
        # held-out F1 0.53; 64 x 2 stopped at 0.25 (results/checks_world_v3).
        train_rows=192,
        pairs_per_prompt=1,    # pairs per training prompt, each with its own response order
        epochs=1,              # passes over the pairs; held-out recovery after each
        batch=1,               # pairs per update
        learning_rate=1e-3,    # AdamW peak step of the rank-16 adapters
        warmup_steps=8,        # updates of linear warm-up
        max_grad_norm=1.0,     # global-norm clip
        logits_chunk=128,      # tokens per output-head chunk
        remat=False,           # one pair of <= 1,600 tokens: activations fit without recompute
        checkpoint_every=16,   # updates between checkpoints (and at each epoch's end)
        eval_rows=32,          # held-out rows whose lists are scored (0 = all)
        eval_temperature=0.0,  # list decoding at evaluation: 0 = greedy
        eval_batch=8,          # held-out rows decoded together
        n_bootstrap=1000,      # replicates of every 95% CI (held-out rows resampled)
    )
    if opts.get("tiny"):
        c.sft.train_rows, c.sft.eval_rows, c.sft.epochs = 2, 2, 1
        c.sft.warmup_steps, c.sft.checkpoint_every, c.sft.n_bootstrap = 0, 1, 50
        c.sft.eval_batch = 2
    return c
