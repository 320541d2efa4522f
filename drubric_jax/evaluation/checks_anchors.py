"""The checks world's anchor lists (METHOD 13): K sampled responses per prompt ranked by
the gold score; the command is `experiments/make_checks_anchors.py` (its docstring: the row
format, resuming, the flags). `write_anchors` writes (and resumes) a file, `anchor_row`
builds one row, `gold_summary` describes a written file. In `evaluation/` because it
samples a model (the `checks` layer sits below `sampling`).
"""
from __future__ import annotations

import json
import os
import time

from absl import logging

from drubric_jax import checks, data
from drubric_jax.checks import world


def read_done(path: str) -> dict:
    """{id: row} of the complete rows of an anchor file being written; truncates the file
    after its last complete line (a line ending in "\\n" that parses). {} when absent.

    Raises:
        ValueError: "<path>:<line>: ..." for a complete line that is not a JSON object
            with an "id" (the file is not one this script wrote, or it is damaged).
    """
    if not os.path.exists(path):
        return {}
    raw = open(path, "rb").read()
    end = raw.rfind(b"\n") + 1  # bytes after the last newline: a partial row
    done = {}
    for lineno, line in enumerate(raw[:end].split(b"\n")[:-1], start=1):
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}:{lineno}: not a JSON row ({e})") from None
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise ValueError(f"{path}:{lineno}: field 'id' missing: not an anchor row")
        done[row["id"]] = row
    if end < len(raw):
        logging.warning("%s: dropped an incomplete last row (%d bytes)", path, len(raw) - end)
        with open(path, "r+b") as f:
            f.truncate(end)
    return done


def anchor_row(prompt_row, responses, truncated, sampling: dict):
    """The anchor-list row of one prompt (module docstring), or None with < 2 responses.

    Args:
        prompt_row: data.Record with valid `meta["checks"]`.
        responses: K str, sample order; truncated: K bool (cut at max_new_tokens).
        sampling: the settings recorded in meta["sampling"].
    """
    keep = [i for i, r in enumerate(responses) if r]
    if len(keep) < 2:
        return None
    resp = [responses[i] for i in keep]
    scores = [checks.gold_score(prompt_row.meta["checks"], r) for r in resp]
    ranking, ties = world.rank_by_gold(scores)
    meta = dict(prompt_row.meta, sampling=sampling, truncated=[bool(truncated[i]) for i in keep])
    return {"id": prompt_row.id, "source": prompt_row.source, "prompt": prompt_row.prompt,
            "responses": resp, "scores": scores, "ranking": ranking, "ties": ties,
            "meta": meta}


def write_anchors(prompts_path: str, out_path: str, cfg, params, tokenizer, *, k: int = 4,
                  max_new_tokens: int = 256, temperature: float = 0.7, seed: int = 0,
                  limit: int = 0, batch: int = 8, model_name: str = "") -> dict:
    """Samples, ranks and appends the anchor rows of the first `limit` prompts (0: all).

    Args:
        prompts_path: make_checks_data output (prompt rows with `meta["checks"]`).
        out_path: the anchor JSONL, appended to (resumed) when it exists.
        cfg, params, tokenizer: the model (`models.load_model`).
        k: responses per prompt (K >= 2); batch: prompts per `sampling.generate` call.

    Returns:
        {"written", "skipped_done", "too_few", "seconds", "seconds_per_prompt" (None when
        nothing was sampled)} of this call.

    Raises:
        ValueError: a prompt row without valid meta.checks (file, line, row, field), k < 2,
            or a resumed file written with other settings or other prompts.
    """
    import jax

    from drubric_jax import sampling as sampling_lib
    from drubric_jax.text import tokenizer as tok_lib

    if k < 2 or batch < 1:
        raise ValueError(f"--k must be >= 2 and --batch >= 1, got {k}, {batch}")
    rows = data.load_jsonl(prompts_path)
    rows = rows[:limit] if limit else rows
    for r in rows:
        checks.true_checks_of(r.meta, f"{prompts_path}:{r.line}: row {r.id!r}")
    settings = {"model": model_name, "k": k, "temperature": temperature,
                "max_new_tokens": max_new_tokens, "seed": seed, "batch": batch}
    done = read_done(out_path)
    ids = {r.id for r in rows}
    for rid, row in done.items():
        if rid not in ids or row.get("meta", {}).get("sampling") != settings:
            raise ValueError(f"{out_path}: row {rid!r} is not a row of {prompts_path} with "
                             f"settings {settings} (field 'meta.sampling'); another --out?")
    method = sampling_lib.method_from_flags(temperature)
    stop = tok_lib.stop_ids(tokenizer)
    stats, t0 = {"written": 0, "skipped_done": len(done), "too_few": 0}, time.time()
    with open(out_path, "a", encoding="utf-8", newline="\n") as f:
        for lo in range(0, len(rows), batch):
            part = rows[lo:lo + batch]
            if all(r.id in done for r in part):
                continue
            ids_ = [tok_lib.chat_ids(tokenizer, [{"role": "user", "content": r.prompt}])
                    for r in part for _ in range(k)]
            out = sampling_lib.generate(
                params, cfg, ids_, key=jax.random.PRNGKey(seed), max_new_tokens=max_new_tokens,
                method=method, stop_ids=stop,
                row_ids=[(lo + i) * k + j for i in range(len(part)) for j in range(k)])
            texts = [tokenizer.decode(out.tokens[i][out.mask[i]], skip_special_tokens=True)
                     for i in range(len(ids_))]
            for i, r in enumerate(part):
                if r.id in done:
                    continue
                row = anchor_row(r, texts[i * k:(i + 1) * k],
                                 [bool(t) for t in out.truncated[i * k:(i + 1) * k]], settings)
                if row is None:
                    stats["too_few"] += 1
                    continue
                f.write(data.jsonl_line(row))
                f.flush()
                stats["written"] += 1
            logging.info("anchors: %d / %d prompts", min(lo + batch, len(rows)), len(rows))
    stats["seconds"] = round(time.time() - t0, 1)
    # Per prompt sampled in this call (written or too few): what a resume or a larger
    # --limit will cost per prompt.
    sampled = stats["written"] + stats["too_few"]
    stats["seconds_per_prompt"] = round(stats["seconds"] / sampled, 2) if sampled else None
    return stats


def gold_summary(path: str) -> dict:
    """Gold-score statistics of an anchor file: rows, responses, mean gold score, the
    fraction of rows whose responses differ in gold score (GRPO's signal: Eq. 21 needs a
    spread), the fraction of responses meeting every check, and the mean per check id."""
    rows = data.load_jsonl(path)
    scores = [s for r in rows for s in r.scores]
    per_check = {}
    for r in rows:
        for t in r.meta["checks"]:
            met = [checks.verdict(t["check"], t["args"], y) for y in r.responses]
            per_check.setdefault(t["check"], []).extend(met)
    n = max(len(scores), 1)
    return {"rows": len(rows), "responses": len(scores), "mean_gold": sum(scores) / n,
            "frac_rows_with_spread": sum(len(set(r.scores)) > 1 for r in rows) / max(len(rows), 1),
            "frac_responses_all_met": sum(s == 1.0 for s in scores) / n,
            "per_check_met": {c: round(sum(v) / len(v), 3) for c, v in sorted(per_check.items())}}
