"""The generator's supervised warm start G_sft as a stage of its own (checks world III).

A deviation for scale, not part of the paper's method: the paper's G_0 is an 8B model that
writes useful rubrics zero-shot; our 135M generator writes no correct check, so this stage
first teaches it the checks world's task by maximum likelihood (`rl.sft`) on pairs of
(the generator's input for a training prompt and K of P_0's responses, the prompt's true
checks as the constrained JSON it emits) (`checks.sft_data`). The rubric-reward
experiments then start from its export.

    run_sft(config, workdir) -> dict of the stage and its evaluations
    heldout_recovery(...)   constraint recovery of one list per evaluated row (the dev
                            split's anchor rows)
    read_sft_rows(...)      the stage's rows, each file checked to be its split

Writes in `workdir`:
    checkpoints/            the LoRA adapters and their AdamW moments, and the stage's
                            position (`rounds.checkpoint`); a rerun resumes from the last
    metrics.jsonl           one row per update (nll, token_accuracy, grad_norm, seconds)
    recovery.jsonl          one row per evaluation on the dev split (`heldout_recovery`):
                            step 0, then after each epoch
    export/generator/       the adapters merged into the base, a Hugging Face directory
                            (`model.generator` of the experiments that start from G_sft),
                            and sft_step.json: the update it holds

Every random choice flows from `config.seed`: the pairs' response orders, the adapters'
init, the epoch order (`numpy.random.default_rng((seed, epoch))`), the evaluation key.
The stage runs on one device; an 8B generator needs no warm start.

Config (`configs/sft_generator.py`): `model.generator`, `generator.*` (the generator's
prompt, schema and budgets: the same inputs the co-evolution loop gives it), `lora.*`,
`data.checks_dir` and `sft.*` (files, pairs, epochs, batch, optimizer, evaluation). Its
files are world v2's splits (`data.splits`, issue 53): pairs from the gen_sft split's anchor
rows, recovery on the dev split's, and a row of another split stops the stage before any
weight loads (`read_sft_rows`).
"""
from __future__ import annotations

import json
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

SFT_ROLE_KEY = 3  # folded into the seed for the adapters' init (the loop's roles use 0..2)
RECOVERY_FILE = "recovery.jsonl"
EXPORT_STEP_FILE = "sft_step.json"  # in the export: the update whose adapters it holds
STATS = ("constraint_f1", "constraint_f1_check_id", "constraint_precision",
         "constraint_recall", "exact", "valid")
"""Per-row values of `heldout_recovery`, in report order."""


def heldout_recovery(generator, params, rows, key: jax.Array,
                     temperature: float = 0.0) -> dict:
    """One list per held-out row from `generator`, and how well it recovers the row's true
    checks (METHOD 13, `checks.recovery.constraint_prf`).

    Args:
        generator: an `evaluator.rubric_generator.RubricGenerator` of checks
            (`rows_per_call` bounds the rows decoded at once).
        params: its params (adapters attached for a LoRA trainee).
        rows: U records with `.id`, `.prompt`, `.responses` (P_0's K answers), `.history`
            and `.meta["checks"]` (anchor rows of prompts never paired: the dev split's
            dev_anchors.jsonl of make_checks_anchors).
        key: PRNG key of the response orders (and of the samples when temperature > 0).
        temperature: 0 = greedy.

    Returns:
        {stat: float64[U] for stat in STATS, "ids": U row ids, "lists": U lists of the
        kept (check, args) items}: constraint_f1 / _precision / _recall with arguments
        matched, constraint_f1_check_id on ids alone (an invalid list scores 0, METHOD 11),
        "exact" 1.0 where F1 = 1, "valid" where the list parsed with >= 1 kept item.

    Raises:
        ValueError: no rows, or a row without valid true checks (names it).
    """
    from drubric_jax.checks.gold import true_checks_of
    from drubric_jax.evaluator.check_rubrics import list_recovery
    from drubric_jax.evaluator.rubric_generator import RubricInput

    if not rows:
        raise ValueError("no held-out rows to evaluate")
    truth = [true_checks_of(r.meta, f"held-out row {r.id!r}") for r in rows]
    rb = generator.generate_batch(
        params, key, [RubricInput(r.prompt, tuple(r.responses), tuple(r.history or ()))
                      for r in rows], num_lists=1, temperature=float(temperature))
    mask = np.asarray(rb.item_mask, bool)
    out = {k: [] for k in STATS}
    lists = []
    for u, t in enumerate(truth):
        items, (p, r, f, f_ids) = list_recovery(rb.texts[u][0], mask[u, 0], t)
        for k, v in zip(STATS, (f, f_ids, p, r, float(f == 1.0),
                                float(rb.list_valid[u, 0]))):
            out[k].append(float(v))
        lists.append(items)
    return {**{k: np.asarray(v, np.float64) for k, v in out.items()},
            "ids": [r.id for r in rows], "lists": lists}


def read_sft_rows(s) -> tuple[list, list, list]:
    """(training anchor rows, held-out prompt rows, dev anchor rows) of `config.sft`, each
    file its split (world v2's splits, `data.splits`; issue 53): the first
    `sft.train_rows` rows of `sft.train_anchors` must be the gen_sft split (G_sft's pairs)
    and the first `sft.eval_rows` of `sft.eval_anchors` the dev split (its per-epoch
    recovery, where its recipe is chosen). Reads no weights.

    Raises:
        data.splits.SplitError (a ValueError): a row of another split (or of none), naming
            the config field, file, line and row, the split found and the split wanted.
        FileNotFoundError / ValueError: a missing file or a bad row (`data.load_jsonl`).
    """
    from drubric_jax.data.schema import load_jsonl
    from drubric_jax.data.splits import STAGE_NAMES, STAGE_SPLITS, require_split

    rows = load_jsonl(s.train_anchors)
    rows = rows[:int(s.train_rows)] if s.train_rows else rows
    require_split(rows, STAGE_SPLITS["sft_pairs"],
                  f"config.sft.train_anchors: {s.train_anchors}",
                  stage=f"{STAGE_NAMES['sft_pairs']} (config.sft.train_anchors)")
    eval_rows = load_jsonl(s.eval_anchors)
    eval_rows = eval_rows[:int(s.eval_rows)] if s.eval_rows else eval_rows
    require_split(eval_rows, STAGE_SPLITS["sft_eval"],
                  f"config.sft.eval_anchors: {s.eval_anchors}",
                  stage=f"{STAGE_NAMES['sft_eval']} (config.sft.eval_anchors)")
    return rows, load_jsonl(s.heldout_prompts), eval_rows


def _examples(config, tokenizer, generator, rows, heldout):
    """(examples, input id lists, target id lists) of the training anchor rows."""
    from drubric_jax.checks.sft_data import sft_examples
    from drubric_jax.text import tokenizer as tok_lib

    s = config.sft
    examples = sft_examples(rows, heldout, np.random.default_rng((int(config.seed), 0)),
                            pairs_per_prompt=int(s.pairs_per_prompt),
                            pool=tuple(config.generator.check_pool),
                            where=s.train_anchors)
    stop = int(tok_lib.stop_ids(tokenizer)[0])
    inputs, targets = [], []
    for e in examples:
        ids, _, _ = generator.prompt_ids(e["prompt"], e["responses"], e["history"], e["order"])
        inputs.append(ids)
        targets.append(tokenizer.encode(e["target"], add_special_tokens=False) + [stop])
    return examples, inputs, targets


def dev_recovery(config, generator_dir: str, temperature: float) -> dict:
    """Constraint recovery of an exported generator (`generator_dir`, e.g. G_sft's
    export/generator) on the dev split's rows (`config.sft.eval_anchors`, its first
    `eval_rows`), one list a row at `temperature`: how a setting of the lists (their
    temperature) is chosen without reading the reported split (METHOD 15). The same
    generator and keys as the stage's own evaluation (`run_sft`).

    Returns:
        `heldout_recovery`'s dict (per-row stats, ids, lists).

    Raises:
        data.splits.SplitError: an eval row of another split; FileNotFoundError: no such
            directory or file.
    """
    from drubric_jax import models
    from drubric_jax.data.schema import load_jsonl
    from drubric_jax.data.splits import STAGE_NAMES, STAGE_SPLITS, require_split
    from drubric_jax.evaluator.rubric_formats import get_format
    from drubric_jax.evaluator.rubric_generator import RubricGenerator
    from drubric_jax.rounds.settings import read as read_settings

    s = config.sft
    st = read_settings(config)
    g = st.generator
    rows = load_jsonl(s.eval_anchors)
    rows = rows[:int(s.eval_rows)] if s.eval_rows else rows
    require_split(rows, STAGE_SPLITS["sft_eval"], f"config.sft.eval_anchors: {s.eval_anchors}",
                  stage=f"{STAGE_NAMES['sft_eval']} (config.sft.eval_anchors)")
    cfg, params, tokenizer = models.load_model(generator_dir, st.model.dtype)
    generator = RubricGenerator(
        cfg, tokenizer, max_items=g.max_items, max_item_chars=g.max_item_chars,
        max_new_tokens=g.max_new_tokens, input_budget=g.input_budget,
        rows_per_call=int(s.eval_batch), per_row_keys=True,
        fmt=get_format("checks", g.check_pool), keep_prompt=g.keep_prompt)
    key = jax.random.fold_in(jax.random.PRNGKey(st.seed), 1)  # the stage's eval key
    return heldout_recovery(generator, params, rows, key, float(temperature))


def check_sft_config(s) -> None:
    """Validates `config.sft` before any file or weight is read.

    Raises:
        types.ConfigError: "config.sft.<field>: <what a good value is>".
    """
    from drubric_jax.types import require

    for field in ("epochs", "batch", "pairs_per_prompt", "checkpoint_every", "eval_batch",
                  "n_bootstrap", "logits_chunk"):
        require(int(s[field]) >= 1, f"config.sft.{field}", f"must be >= 1, got {s[field]}")
    for field in ("train_rows", "eval_rows", "warmup_steps"):
        require(int(s[field]) >= 0, f"config.sft.{field}", f"must be >= 0, got {s[field]}")
    require(float(s.learning_rate) > 0, "config.sft.learning_rate",
            f"must be > 0, got {s.learning_rate}")
    require(float(s.eval_temperature) >= 0, "config.sft.eval_temperature",
            f"must be >= 0 (0 = greedy), got {s.eval_temperature}")


def _bucket(n: int, multiple: int) -> int:
    return int(math.ceil(n / multiple) * multiple)


def run_sft(config, workdir: str) -> dict:
    """Trains (or resumes) G_sft and evaluates it on the dev split (module docstring).

    Returns:
        {"examples", "steps", "epochs", "batch", "evals": the recovery rows (step, epoch,
        train_nll, means, per_row, ids, lists, seconds), "export": the directory,
        "input_bucket", "target_bucket"}. The CIs are the report's
        (`evaluation.checks_sft.summarize`).

    Raises:
        types.ConfigError: a bad config.sft field (`check_sft_config`).
        FileNotFoundError: a missing data file (names the config field and the commands
            that build it); ValueError: as `checks.sft_data.sft_examples` and the config;
            data.splits.SplitError: a row of another split (`read_sft_rows`).
    """
    from tqdm import tqdm

    from drubric_jax import models
    from drubric_jax.evaluator.rubric_formats import get_format
    from drubric_jax.evaluator.rubric_generator import RubricGenerator
    from drubric_jax.models import lora
    from drubric_jax.models.export import export_hf_dir
    from drubric_jax.rl import sft
    from drubric_jax.rl.train_config import TrainConfig
    from drubric_jax.rl.train_step import TrainState, trainable_init
    from drubric_jax.rounds.checkpoint import Checkpointer
    from drubric_jax.rounds.run_logging import MetricsWriter, add_wall_time, read_metrics

    from drubric_jax.rounds.roles import trainee_config
    from drubric_jax.rounds.model_sources import LoadedModel
    from drubric_jax.rounds.settings import read as read_settings

    s = config.sft
    check_sft_config(s)
    # The run config's fields (model, lora, generator, seed, log, data) read once.
    st = read_settings(config)
    g = st.generator
    for field in ("train_anchors", "heldout_prompts", "eval_anchors"):
        if not os.path.exists(s[field]):
            build = st.data.checks_build
            raise FileNotFoundError(
                f"config.sft.{field}: no such file {s[field]}" + (
                    "\nBuild the checks world's files first (from the repository root):\n  "
                    + build.strip().replace("\n", "\n  ") if build else ""))
    with open(s.train_anchors, encoding="utf-8") as f:  # before any weight loads
        have = sum(1 for line in f if line.strip())
    if have < int(s.train_rows):
        raise ValueError(
            f"config.sft.train_rows: {s.train_rows} training prompts asked, {s.train_anchors} "
            f"has {have} anchor rows; extend it (it resumes) with make_checks_anchors "
            f"--split=gen_sft --limit={s.train_rows}, or lower train_rows")
    rows, heldout, eval_rows = read_sft_rows(s)  # each file its split, before any weight
    os.makedirs(workdir, exist_ok=True)
    t_start = time.perf_counter()
    if st.lora.rank < 1:
        raise ValueError("config.lora.rank: the warm start trains LoRA adapters (rank >= 1)")
    cfg, base, tokenizer = models.load_model(st.model.generator, st.model.dtype)
    tcfg = trainee_config(LoadedModel(st.model.generator, cfg, base, tokenizer), st.lora,
                          st.model.master_dtype)
    generator = RubricGenerator(
        tcfg, tokenizer, max_items=g.max_items, max_item_chars=g.max_item_chars,
        max_new_tokens=g.max_new_tokens, input_budget=g.input_budget,
        rows_per_call=int(s.eval_batch), per_row_keys=True,
        fmt=get_format("checks", g.check_pool), keep_prompt=g.keep_prompt)
    examples, inputs, targets = _examples(config, tokenizer, generator, rows, heldout)
    batch = int(s.batch)
    steps_per_epoch = len(examples) // batch
    if steps_per_epoch < 1:
        raise ValueError(f"config.sft.batch={batch} exceeds the {len(examples)} pairs")
    total = steps_per_epoch * int(s.epochs)
    # Fixed buckets: one compiled step for the whole stage.
    p_bucket = _bucket(max(map(len, inputs)), 64)
    n_bucket = _bucket(max(map(len, targets)), 16)
    train_cfg = TrainConfig(learning_rate=float(s.learning_rate),
                            warmup_steps=int(s.warmup_steps), weight_decay=0.0,
                            max_grad_norm=float(s.max_grad_norm), beta=0.0,
                            micro_batch_size=batch, logits_chunk=int(s.logits_chunk),
                            remat=bool(s.remat), temperature=1.0)
    optimizer, step_fn = sft.make_sft_step(tcfg, train_cfg)
    key = jax.random.fold_in(jax.random.PRNGKey(st.seed), SFT_ROLE_KEY)
    adapters = trainable_init(tcfg, key, base)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=adapters,
                       opt_state=optimizer.init(adapters))
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=1)
    done = 0
    if ckpt.latest() is not None:
        state, meta = ckpt.restore(None, state)
        done = int(meta["step"])
        if meta.get("examples") != len(examples) or meta.get("batch") != batch:
            raise ValueError(f"{workdir}: its checkpoint was made with {meta.get('examples')} "
                             f"pairs in batches of {meta.get('batch')}, this config gives "
                             f"{len(examples)} in batches of {batch}; use a new workdir")
    rec_path = os.path.join(workdir, RECOVERY_FILE)
    evals = []
    if os.path.exists(rec_path):
        with open(rec_path, encoding="utf-8") as f:
            evals = [json.loads(line) for line in f if line.strip()]
    writer = MetricsWriter(workdir, tensorboard=False)
    eval_key = jax.random.fold_in(jax.random.PRNGKey(st.seed), 1)
    # The running epoch's losses so far (a resumed stage reads those it logged).
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    logged = {r["step"]: r for r in (read_metrics(metrics_path)
                                     if os.path.exists(metrics_path) else [])
              if r.get("phase") == "sft"}
    epoch_nll = [logged[i]["nll"] for i in range(done - done % steps_per_epoch + 1, done + 1)
                 if i in logged]

    def evaluate(step: int, epoch: int):
        if any(e["step"] == step for e in evals):
            return
        t0 = time.perf_counter()
        params = lora.attach(base, state.params)
        per_row = heldout_recovery(generator, params, eval_rows, eval_key,
                                   float(s.eval_temperature))
        row = {"step": step, "epoch": epoch,
               "train_nll": float(np.mean(epoch_nll)) if epoch_nll else None,
               "means": {k: float(np.mean(per_row[k])) for k in STATS},
               "per_row": {k: np.asarray(per_row[k]).tolist() for k in STATS},
               "ids": per_row["ids"],
               "lists": [[[c, a] for c, a in lst] for lst in per_row["lists"]],
               "seconds": time.perf_counter() - t0}
        evals.append(row)
        with open(rec_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    evaluate(0, 0)
    bar = tqdm(total=total, initial=done, desc="G_sft", unit="step",
               disable=not st.log.progress)
    try:
        while done < total:
            epoch, k = divmod(done, steps_per_epoch)
            # The epoch's order: a function of (seed, epoch) only, so a resume redraws it.
            order = np.random.default_rng((st.seed, 1, epoch)).permutation(
                len(examples))
            idx = order[k * batch:(k + 1) * batch]
            b = sft.pack_batch([inputs[i] for i in idx], [targets[i] for i in idx],
                               int(tokenizer.pad_token_id or 0), p_bucket, n_bucket)
            t0 = time.perf_counter()
            state, m = step_fn(state, b, base)
            m = {k2: float(v) for k2, v in m.items()}
            if not np.isfinite(m["nll"]):
                raise FloatingPointError(f"G_sft step {done + 1}: nll is {m['nll']}")
            done += 1
            epoch_nll.append(m["nll"])
            writer.write(done, {"kind": "train", "phase": "sft", "step": done,
                                "epoch": epoch, **m, "seconds": time.perf_counter() - t0})
            bar.update(1)
            end_of_epoch = done % steps_per_epoch == 0
            if end_of_epoch or done % int(s.checkpoint_every) == 0:
                ckpt.save(done, state, {"step": done, "examples": len(examples),
                                        "batch": batch}, force=True)
            if end_of_epoch:
                ckpt.wait()
                evaluate(done, done // steps_per_epoch)
                epoch_nll = []
    finally:
        bar.close()
        writer.close()
        ckpt.close()
    export = os.path.join(workdir, "export", "generator")
    # The export holds the last update's adapters: a stage extended by more epochs rewrites it.
    marker = os.path.join(export, EXPORT_STEP_FILE)
    exported = None
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as f:
            exported = json.load(f).get("step")
    if exported != done:
        merged = lora.merge(base, state.params, tcfg)  # float32, adapters folded in
        export_hf_dir(merged, tcfg.replace(lora_rank=0, param_dtype="float32"), export,
                      tokenizer, bos_id=tokenizer.bos_token_id or 0,
                      eos_id=tokenizer.eos_token_id or 0)
        with open(marker, "w", encoding="utf-8") as f:
            json.dump({"step": done}, f)
    add_wall_time(workdir, "G_sft", time.perf_counter() - t_start)
    return {"examples": len(examples), "steps": total, "epochs": int(s.epochs), "batch": batch,
            "input_bucket": p_bucket, "target_bucket": n_bucket, "export": export,
            "evals": sorted(evals, key=lambda e: e["step"])}
