"""Evaluator benchmark outputs: report.json, trace.jsonl lines, the trace.html page, and
the log lines (`file_line`, `timing_table`).

Axis legend (docs/CONVENTIONS.md): K responses per row, M rubric items per list.
"""
from __future__ import annotations

import html
import json
import math

from drubric_jax.data.schema import write_json
from drubric_jax.evaluation.judges import RUBRIC_METHODS


def jsonable(x):
    """`x` with numpy arrays and scalars as lists / Python numbers and inf / nan as strings
    (strict JSON has no non-finite numbers)."""
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if hasattr(x, "tolist"):
        return jsonable(x.tolist())
    return x


def trace_line(record: dict) -> str:
    """One trace.jsonl line (newline included)."""
    return json.dumps(jsonable(record), ensure_ascii=False) + "\n"


def write_report(path: str, report: dict) -> None:
    """report.json, indented one space per level, written atomically (`data.write_json`)."""
    write_json(path, jsonable(report))


def _cell_color(p: float, v: int) -> str:
    return "#c8e6c9" if v else ("#ffcdd2" if p < 0.25 else "#ffe0b2")


def _pre(text: str, limit: int = 4000) -> str:
    body = html.escape(text[:limit]) + (html.escape(f" ... [{len(text) - limit} more chars]")
                                        if len(text) > limit else "")
    return f"<pre>{body}</pre>"


def write_html(path: str, sections: list) -> None:
    """trace.html: per example the prompt, responses, rubric grids, scores and gold ranks.

    Args:
        path: output file.
        sections: list of (data file path, [(row, {method: [sample dicts]})]); every text
            is HTML-escaped, so the page holds no markup from the data.
    """
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>evaluator trace</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}"
             "pre{white-space:pre-wrap;background:#f6f6f6;padding:6px}"
             "table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ccc;"
             "padding:3px 6px;font-size:13px;vertical-align:top}"
             "details{margin:4px 0}.ex{border-top:3px solid #444;margin-top:24px}</style>",
             "</head><body><h1>Evaluator trace</h1>"]
    for file_path, html_rows in sections:
        parts.append(f"<h2>{html.escape(file_path)}</h2>")
        for row, methods in html_rows:
            rec = row.rec
            parts.append(f"<div class='ex'><h3>{html.escape(rec.id)} "
                         f"<small>({html.escape(rec.source)}, line {rec.line})</small></h3>")
            for turn in rec.history:
                parts.append(f"<b>earlier {html.escape(turn['role'])}:</b>"
                             + _pre(turn["content"], 1500))
            parts.append("<b>prompt:</b>" + _pre(rec.prompt))
            for i, y in enumerate(row.responses):
                parts.append(f"<details><summary>response {i} (gold rank {row.gold[i]})"
                             f"</summary>{_pre(y)}</details>")
            for m, samples in methods.items():
                for s, d in enumerate(samples):
                    # Deterministic judges repeat one sample n times: show it once.
                    if s and m not in RUBRIC_METHODS:
                        break
                    parts.append(f"<h4>{html.escape(m)} sample {s}</h4>")
                    parts.append(_grid(row, d, m))
            parts.append("</div>")
    parts.append("</body></html>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))


def _grid(row, d, method) -> str:
    """Table of one sample: items x responses P(yes) (rubric methods) or the judge's P(yes)."""
    head = "".join(f"<th>resp {i}<br>gold {row.gold[i]}</th>" for i in range(row.k))
    out = [f"<table><tr><th>item</th><th>w</th>{head}</tr>"]
    if method in RUBRIC_METHODS:
        if not d["valid"]:
            out.append(f"<tr><td colspan='{row.k + 2}'>invalid list "
                       f"({html.escape(d['finish_reason'])}): "
                       f"{html.escape(d['raw_text'][:300])}</td></tr>")
        for m, (text, w) in enumerate(d["items"]):
            cells = "".join(
                f"<td style='background:{_cell_color(d['p_yes'][i][m], d['verdicts'][i][m])}'>"
                f"{d['p_yes'][i][m]:.2f}</td>" for i in range(row.k))
            out.append(f"<tr><td>{html.escape(text)}</td><td>{w}</td>{cells}</tr>")
        out.append(f"<tr><td colspan='2'>order shown</td><td colspan='{row.k}'>"
                   f"{html.escape(str(d['order']))}</td></tr>")
    elif "p_yes" in d:
        cells = "".join(f"<td>{p:.3f}</td>" for p in d["p_yes"])
        out.append(f"<tr><td>P(yes) high quality</td><td></td>{cells}</tr>")
        if "pairwise" in d:
            out.append(f"<tr><td colspan='{row.k + 2}'>pairwise: P(A better) with A=resp 0: "
                       f"{d['pairwise']['p_ab']:.3f}; with A=resp 1: "
                       f"{d['pairwise']['p_ba']:.3f}</td></tr>")
    scores = d.get("variant_scores", {"": d.get("scores", [])})
    for variant, sc in scores.items():
        cells = "".join(f"<td><b>{float(x):.3f}</b></td>" for x in sc)
        out.append(f"<tr><td><b>score {html.escape(variant)}</b></td><td></td>{cells}</tr>")
    out.append("</table>")
    return "".join(out)


def file_line(path: str, section: dict) -> str:
    """One log line of a file's section: strict accuracy [95% CI] and s/row per method."""
    parts = []
    for m, e in section["methods"].items():
        lo, hi = e["strict_acc"]["ci95"]
        parts.append(f"{m} {e['strict_acc']['mean']:.3f} [{lo:.2f}, {hi:.2f}] "
                     f"{section['timing'][m]['s_per_row']:.2f}s/row")
    return f"{path} ({section['n_rows']} rows, {section['wall_s']:.0f} s): " + "; ".join(parts)


def timing_table(report: dict) -> str:
    """Seconds per row and rows per second per method over all files (text table)."""
    secs, rows = {}, {}
    for section in report["files"].values():
        for m, t in section["timing"].items():
            secs[m] = secs.get(m, 0.0) + t["s_per_row"] * section["n_rows"]
            rows[m] = rows.get(m, 0) + section["n_rows"]
    lines = [f"{'method':<24}{'rows':>6}{'s/row':>9}{'rows/s':>9}"]
    for m in secs:
        rate = f"{rows[m] / secs[m]:>9.3f}" if secs[m] > 0 else f"{'-':>9}"
        lines.append(f"{m:<24}{rows[m]:>6}{secs[m] / max(rows[m], 1):>9.2f}{rate}")
    lines.append("(the variants of one rubric evaluator share one generator and verifier "
                 "pass: the same seconds, not additive)")
    lines.append(f"total: {report['total_rows']} rows in {report['wall_s']:.0f} s "
                 f"({report['s_per_row']:.2f} s/row, model load included)")
    return "\n".join(lines)
