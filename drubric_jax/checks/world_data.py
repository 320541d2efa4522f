"""The checks world's data builder (METHOD 13): base prompts with checkable constraints
appended in the checkers' own words, the true checks in each row's meta; the command is
`experiments/make_checks_data.py` (its docstring: the row format, the flags, world v1 and v2).

`make(out, ...)` writes the prompt files and OUT/manifest.json once: world v1's
OUT/train.jsonl and OUT/heldout.jsonl, or world v2's five disjoint splits (OUT/gen_sft.jsonl,
gen_rl.jsonl, policy.jsonl, dev.jsonl, heldout.jsonl; `data.splits`, issue 53).
`make_rows` (v1: IFEval's ranges) and `make_rows_v2` (v2: the calibrated pool, rows that
fit every role's input, cut into the splits) draw the rows; `calibration_bases` are the
base prompts kept apart for `experiments.calibrate_checks`. Same seed, byte-identical files.
"""
from __future__ import annotations

import json
import os

from drubric_jax.checks import world
from drubric_jax.data.schema import jsonl_line, load_jsonl_files

# drubric_jax/checks/world_data.py -> the repository root, three levels up.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_SOURCES = ("alpaca_eval/eval.jsonl", "vicuna_bench/question.jsonl",
                   "mt_bench/question.jsonl", "arena_hard/v0.1.jsonl")
# ~100 tokens of SmolLM2's tokenizer; with up to 3 constraint sentences the prompt stays
# within about 128-256 tokens.
DEFAULT_MAX_BASE_CHARS = 400
V1_SPLITS = ("train", "heldout")  # world v1's two files (world v2: `data.splits`)


def ifeval_prompts(shared_dir: str) -> set:
    """The IFEval prompts (`ifeval/input_data.jsonl` under shared_dir/data), stripped; an
    empty set when the file is absent."""
    path = os.path.join(shared_dir, "data", "ifeval", "input_data.jsonl")
    if not os.path.exists(path):
        return set()
    with open(path, encoding="utf-8") as f:
        return {json.loads(line)["prompt"].strip() for line in f if line.strip()}


def base_prompts(paths, max_base_chars: int, exclude=frozenset(), stats=None) -> list:
    """The usable base prompts of prompt files, in file order.

    Args:
        paths: shared-schema JSONL files (prompt-only rows; rows with history are skipped).
        max_base_chars: longer prompts are skipped.
        exclude: prompt texts (stripped) never to use (IFEval's).
        stats: optional dict counting "kept", "too_long", "duplicate", "ifeval",
            "history".

    Returns:
        list[data.Record].

    Raises:
        ValueError: a path under an `ifeval` folder (IFEval is an evaluation set), or a bad
            row (`data.load_jsonl`: file, line, field).
    """
    stats = {} if stats is None else stats
    out, seen = [], set()
    for p in paths:
        if "ifeval" in os.path.normpath(p).split(os.sep):
            raise ValueError(f"--sources: {p} is IFEval's data, an evaluation set: never a "
                             "source of training prompts")
    for rec in load_jsonl_files(paths):
        text = rec.prompt.strip()
        why = ("history" if rec.history else "too_long" if len(rec.prompt) > max_base_chars
               else "ifeval" if text in exclude else "duplicate" if text in seen else "kept")
        stats[why] = stats.get(why, 0) + 1
        if why == "kept":
            seen.add(text)
            out.append(rec)
    return out


def make_rows(bases, seed: int, n_train: int, n_heldout: int, max_checks: int = 3) -> dict:
    """{"train": rows, "heldout": rows} (module docstring's layout) from base prompts.

    Raises:
        ValueError: fewer base prompts than n_train + n_heldout.
    """
    import numpy as np

    if n_train + n_heldout > len(bases):
        raise ValueError(f"--train={n_train} + --heldout={n_heldout} > the {len(bases)} usable "
                         "base prompts (add --sources or raise --max_base_chars)")
    order = np.random.default_rng(seed).permutation(len(bases))
    rows = {s: [] for s in V1_SPLITS}
    for j in range(n_train + n_heldout):
        split = V1_SPLITS[0] if j < n_train else V1_SPLITS[1]
        base = bases[int(order[j])]
        true = world.draw_constraints(base.prompt, np.random.default_rng([seed, j]), max_checks)
        rows[split].append({
            "id": f"checks_world/{split}/{base.id}", "source": f"checks_world:{split}",
            "prompt": world.compose_prompt(base.prompt, true),
            "meta": {"checks": true, "base_id": base.id, "base_source": base.source,
                     "base_prompt": base.prompt, "seed": seed}})
    return rows


# World v2 defaults (issue 40): the policy's prompt and answer budgets and the generator's
# input that every kept row must fit (configs/smollm2_cpu.py `checks_world(version=2)`).
V2_MAX_BASE_CHARS = 300
V2_BUDGETS = {"max_prompt_tokens": 128, "response_tokens": 64, "k": 8, "generator_budget": 1536}
V2_CALIBRATION = 240  # base prompts kept apart for experiments.calibrate_checks
# World v2's split sizes (issue 53; `data.splits`): the 1,149 base prompts of <= 300
# characters less the 240 calibration ones leave 909, of which the rows a role's input
# would cut are skipped.
V2_SPLIT_SIZES = {"gen_sft": 192, "gen_rl": 64, "policy": 128, "dev": 64, "heldout": 256}


def shuffled(bases, seed: int) -> list:
    """The base prompts in the seed's order (the order every split is cut from)."""
    import numpy as np

    return [bases[int(i)] for i in np.random.default_rng(seed).permutation(len(bases))]


def calibration_bases(bases, seed: int, n: int) -> list:
    """The calibration prompts: the last n of the seed's order (the splits are cut from the
    front and never reach them; `make_rows_v2` checks)."""
    return shuffled(bases, seed)[len(bases) - n:] if n else []


def parse_checks_range(text: str) -> tuple:
    """"1" -> (1, 1); "1-3" -> (1, 3).

    Raises:
        ValueError: not N or N-M with 1 <= N <= M.
    """
    lo, _, hi = str(text).partition("-")
    try:
        lo, hi = int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"--checks: {text!r} is not N or N-M") from None
    if not 1 <= lo <= hi:
        raise ValueError(f"--checks: need 1 <= N <= M, got {text!r}")
    return lo, hi


def make_rows_v2(bases, seed: int, sizes, pool, *, checks=(1, 1),
                 n_calibration: int = V2_CALIBRATION, fits=None, stats=None) -> dict:
    """World v2's disjoint prompt splits ({split: rows}, `data.splits`): base prompts in
    the seed's order, each with constraints from the pool (`world.draw_from_pool`, rng
    [seed, j] for the j-th base prompt of the order), cut into the splits in the order of
    `sizes`, each base prompt used once. A row `fits(prompt)` refuses (a constraint would be
    cut) is skipped and counted in stats["cut"]; a base prompt equal to one already used or
    to a calibration prompt up to case and punctuation (`splits.base_key`) is skipped and
    counted in stats["near_duplicate"]; the next base prompt is used. Each row is tagged
    `meta["split"]`; `splits.check_disjoint` checks the result.

    Args:
        bases: the usable base prompts (`base_prompts`), in file order.
        sizes: {split: rows}, in cut order (e.g. `V2_SPLIT_SIZES`); splits of
            `data.splits.SPLITS`.
        pool: list of `checks.pool.Variant`.
        checks: (min, max) constraints per prompt.
        fits: prompt text -> bool (None: every row fits).
        stats: optional dict the counts go to, and stats["positions"][split] = [first,
            end) positions of the seed's order the split was cut from.

    Returns:
        {split: list of row dicts}, the splits in the order of `sizes`.

    Raises:
        ValueError: an unknown split, or the usable base prompts (those before the
            calibration ones) run out (names the split and the counts).
    """
    from drubric_jax.data import splits as splits_lib

    stats = {} if stats is None else stats
    import numpy as np

    for split in sizes:
        splits_lib.prompt_file(split)  # raises on an unknown split
    order = shuffled(bases, seed)
    usable = len(order) - n_calibration
    # Calibration prompts never return as a split's base prompt, even reworded in case.
    used = {splits_lib.base_key(b.prompt) for b in order[usable:]}
    rows, j = {s: [] for s in sizes}, 0
    positions = stats.setdefault("positions", {})
    for split, want in sizes.items():
        first = j
        while len(rows[split]) < int(want):
            if j >= usable:
                raise ValueError(
                    f"{split}: ran out of base prompts after {j} ({n_calibration} kept for "
                    f"calibration, {stats.get('cut', 0)} cut, "
                    f"{stats.get('near_duplicate', 0)} near duplicates); wanted "
                    f"{dict(sizes)}: lower the split sizes or add --sources")
            base = order[j]
            true = world.draw_from_pool(base.prompt, np.random.default_rng([seed, j]), pool,
                                        *checks)
            j += 1
            key = splits_lib.base_key(base.prompt)
            if key in used:
                stats["near_duplicate"] = stats.get("near_duplicate", 0) + 1
                continue
            prompt = world.compose_prompt(base.prompt, true)
            if fits is not None and not fits(prompt):
                stats["cut"] = stats.get("cut", 0) + 1
                continue
            used.add(key)
            rows[split].append({
                "id": f"checks_world/{split}/{base.id}", "source": f"checks_world:{split}",
                "prompt": prompt,
                "meta": {"checks": true, "base_id": base.id, "base_source": base.source,
                         "base_prompt": base.prompt, "seed": seed, "world_version": 2,
                         "split": split}})
        positions[split] = [first, j]
    splits_lib.check_disjoint(rows)
    return rows


def v2_fits(pool, budgets: dict, tok, max_items: int = 5):
    """prompt -> bool: `checks.fit` with the policy's tokenizer `tok` (the run's; the
    command passes SmolLM2's), the generator's list of checks naming only the pool's ids and
    its request never cut (`generator.keep_prompt`: the responses share what the request
    leaves)."""
    from drubric_jax.checks import fit
    from drubric_jax.checks.schema import check_lines

    ids = tuple(dict.fromkeys(v.check for v in pool))
    render = fit.generator_render(tok, check_lines(ids), max_items)

    def fits(prompt):
        if fit.policy_prompt_tokens(tok, prompt) > budgets["max_prompt_tokens"]:
            return False
        return fit.generator_keeps_prompt(
            tok, prompt, k=budgets["k"], response_tokens=budgets["response_tokens"],
            budget=budgets["generator_budget"], render=render, keep_prompt=True)[0]
    return fits


def write_once(path: str, lines, force: bool) -> None:
    """Writes `lines` (str) to `path`; an existing file is an error unless force.

    Raises:
        FileExistsError: path exists and not force.
    """
    if os.path.exists(path) and not force:
        raise FileExistsError(f"{path} exists (written once; --force to overwrite)")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(lines)


def make(out: str, *, seed: int = 0, n_train: int = 256, n_heldout: int = 64,
         sources=DEFAULT_SOURCES, shared_dir: str = "",
         max_base_chars: int = DEFAULT_MAX_BASE_CHARS, max_checks: int = 3,
         force: bool = False, version: int = 1, pool: str = "", checks: str = "1",
         n_calibration: int = V2_CALIBRATION, budgets: dict | None = None,
         tokenizer=None, sizes: dict | None = None) -> dict:
    """Writes a checks world's prompt files and OUT/manifest.json once; returns the manifest.

    Version 1 writes OUT/train.jsonl and OUT/heldout.jsonl (`n_train`, `n_heldout` rows),
    drawn with IFEval's ranges (`make_rows`). Version 2 writes the five disjoint splits
    (`data.splits`: OUT/gen_sft.jsonl, gen_rl.jsonl, policy.jsonl, dev.jsonl,
    heldout.jsonl; `sizes`, default `V2_SPLIT_SIZES`) from the calibrated pool at `pool`
    with `checks` ("1" or "1-3") per prompt (`make_rows_v2`), keeping the rows whose
    constraints no role's input cuts, measured with `tokenizer` (the policy's; required for
    version 2). The manifest lists, per split, its file, rows, seed, the positions of the
    seed's order it was cut from and the file's sha256. Same arguments, byte-identical
    files.

    Raises:
        FileExistsError: an output exists and not force (nothing is written then).
        ValueError / FileNotFoundError: as `base_prompts`, `make_rows` and `make_rows_v2`;
            `sizes` given to version 1.
    """
    import hashlib

    from drubric_jax.data import splits as splits_lib

    shared_dir = shared_dir or os.path.join(REPO, "..", "shared")
    paths = [p if os.path.isabs(p) else os.path.join(shared_dir, "data", p) for p in sources]
    if version == 2:
        sizes = {s: int(n) for s, n in (sizes or V2_SPLIT_SIZES).items()}
        names = [s for s in splits_lib.SPLITS if s in sizes]
        outs = [os.path.join(out, splits_lib.prompt_file(s)) for s in names]
    elif version == 1:
        if sizes:
            raise ValueError("sizes (the split sizes) are world v2's; version 1 takes "
                             "n_train and n_heldout")
        names = list(V1_SPLITS)
        outs = [os.path.join(out, f"{s}.jsonl") for s in names]
    else:
        raise ValueError(f"--version must be 1 or 2, got {version}")
    outs.append(os.path.join(out, "manifest.json"))
    if not force and any(os.path.exists(p) for p in outs):
        raise FileExistsError(f"{[p for p in outs if os.path.exists(p)]} exist (written once; "
                              "--force to overwrite)")
    stats = {}
    bases = base_prompts(paths, max_base_chars, ifeval_prompts(shared_dir), stats)
    manifest = {"version": version, "seed": seed}
    if version == 1:
        manifest.update(train=n_train, heldout=n_heldout)
    manifest.update(max_base_chars=max_base_chars, sources=list(sources), base_prompts=stats)
    if version == 1:
        rows = make_rows(bases, seed, n_train, n_heldout, max_checks)
        manifest["max_checks"] = max_checks
    else:
        from drubric_jax.checks.pool import load_pool

        if tokenizer is None:
            raise ValueError("version 2 needs the policy's tokenizer (make(tokenizer=...)) "
                             "to keep only rows whose constraints fit every role's input")
        variants = load_pool(pool)
        budgets = dict(V2_BUDGETS, **(budgets or {}))
        lo, hi = parse_checks_range(checks)
        cut_sizes = {s: sizes[s] for s in splits_lib.CUT_ORDER if s in sizes}
        rows = make_rows_v2(bases, seed, cut_sizes, variants, checks=(lo, hi),
                            n_calibration=n_calibration,
                            fits=v2_fits(variants, budgets, tokenizer), stats=stats)
        positions = stats.pop("positions")
        manifest.update(checks=[lo, hi], pool=os.path.abspath(pool),
                        pool_labels=[v.label for v in variants], budgets=budgets,
                        calibration=n_calibration, cut_order=list(cut_sizes))
    lines = {s: [jsonl_line(r) for r in rows[s]] for s in names}
    if version == 2:
        manifest["splits"] = {
            s: {"file": splits_lib.prompt_file(s), "rows": len(rows[s]), "seed": seed,
                "positions": positions[s], "purpose": splits_lib.PURPOSE[s],
                "sha256": hashlib.sha256("".join(lines[s]).encode("utf-8")).hexdigest()}
            for s in names}
    os.makedirs(out, exist_ok=True)
    for s, path in zip(names, outs):
        write_once(path, lines[s], force)
    write_once(outs[-1], [json.dumps(manifest, indent=1) + "\n"], force)
    return manifest
