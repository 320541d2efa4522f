"""World v2's calibration (METHOD 13): the prompts of each candidate check variant, the
pass rate of P_0's samples with its CI over prompts, and the table of kept variants; the
command is `experiments/calibrate_checks.py` (its docstring: the procedure and the flags).
"""
from __future__ import annotations

import numpy as np

from drubric_jax.checks import pool as pool_lib

SAMPLES_FILE, TABLE_JSON, TABLE_MD = ("calibration_samples.jsonl", "calibration.json",
                                      "calibration.md")


def calibration_prompts(bases, variant_index: int, variant, n: int, seed: int) -> list:
    """n (prompt, true checks) of one variant: base prompts (variant_index * n + j) mod
    len(bases), each with one constraint of the variant."""
    from drubric_jax.checks import world

    out = []
    for j in range(n):
        base = bases[(variant_index * n + j) % len(bases)]
        args = variant.draw(np.random.default_rng([seed, 7919, variant_index, j]),
                            prompt=base.prompt)
        true = [{"check": variant.check, "args": args}]
        out.append((world.compose_prompt(base.prompt, true), true))
    return out


def pass_rate(passed: np.ndarray, n_boot: int, seed: int) -> dict:
    """Pass rate of a [prompts, samples] 0/1 grid and its 95% CI, prompts resampled."""
    from drubric_jax.evaluation.intervals import percentile_interval, resample_weights

    per_prompt = passed.mean(axis=1)
    w = resample_weights(per_prompt.size, n_boot, seed)
    return {"rate": float(per_prompt.mean()),
            "ci": percentile_interval(w @ per_prompt / per_prompt.size),
            "prompts": int(passed.shape[0]), "samples": int(passed.size)}


def summarize(done: dict, band, n_boot: int, seed: int) -> dict:
    """The table of every sampled variant (candidate order) and the kept labels."""
    rows = []
    for v in pool_lib.CANDIDATES:
        if v.label not in done:
            continue
        d = done[v.label]
        passed = np.asarray(d["passed"], np.float64)
        r = pass_rate(passed, n_boot, seed)
        r.update(label=v.label, check=v.check,
                 truncated=float(np.mean(np.asarray(d["truncated"], np.float64))))
        rows.append(r)
    rates = {r["label"]: r["rate"] for r in rows}
    kept = pool_lib.kept_labels(rates, band)
    for r in rows:
        r["kept"] = r["label"] in kept
    return {"version": pool_lib.POOL_VERSION, "band": list(band), "kept": kept, "rows": rows}


def markdown(table: dict) -> str:
    lines = [
        "# Calibration of world v2's check pool",
        "",
        f"Command: `{table.get('command', '')}`  ",
        f"Wall time: {table.get('seconds', float('nan')):.0f} s on {table.get('device', '?')}; "
        f"{table.get('settings', '')}",
        "",
        f"Kept ({len(table['kept'])} of {len(table['rows'])}): pass rate in "
        f"[{table['band'][0]:.2f}, {table['band'][1]:.2f}].",
        "",
        "| variant | pass rate | 95% CI (prompts resampled) | prompts x samples | cut at budget | kept |",
        "|---|---|---|---|---|---|"]
    for r in table["rows"]:
        lines.append(f"| `{r['label']}` | {r['rate']:.3f} | [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]"
                     f" | {r['prompts']} x {r['samples'] // max(r['prompts'], 1)} | "
                     f"{r['truncated']:.2f} | {'yes' if r['kept'] else 'no'} |")
    return "\n".join(lines) + "\n"
