r"""Evaluator benchmark: how well each evaluator orders human-ranked responses (METHOD 6, 7).

    python -m experiments.eval_evaluator --config=configs/eval_evaluator.py \
        --config.data=../shared/data/judgebench/gpt.jsonl --config.max_rows=20 \
        --workdir=runs/eval_judgebench

Methods (configs/eval_evaluator.py METHODS):
- dynamic: G_phi(x, C) writes rubric lists from the whole candidate set; the frozen
  verifier answers every item for every response; Eq. 12 gives the scores.
- static: RaR-style lists from the prompt only, same verifier and Eq. 12.
- direct: the verifier's P(yes) to "is this a high-quality response?" per response. For
  pair rows the pairwise question "is A better than B?" is also asked in both orders and
  reported as direct_pairwise_ab / _ba / _avg with the first-position win rate (position
  bias).
- direct_set: the same pointwise judge with the whole response set shown as context.
- random: uniform random scores from the seed (sanity floor).

Diagnostic variants dynamic_soft / static_soft reuse the same lists and verifier calls
with P(yes) in place of the 0/1 verdict in Eq. 12 (they show whether the verifier's
probabilities order the responses even when its hard verdicts tie).

Each rubric method is AVG@n: n independently sampled lists per row, each with a fresh
response order in the generator prompt; every metric is computed per sample over all rows
and reported as mean, std (ddof=1 when n > 1) and the per-sample values. Deterministic
judges (direct*) are computed once and repeated n times.

Metrics (drubric_jax.metrics, METHOD 7 and 11): strict pairwise accuracy (a predicted tie is
wrong; gold-tied pairs skipped), accuracy with predicted ties excluded, tie rate, strict
top-1 (rows whose responses are all gold-tied are skipped), nDCG (linear gains from the
gold ranks), Delta_gap (Eq. 2, pooled over ordered pairs). RM-Bench rows (meta.label and
meta.style) add the 9 chosen-vs-rejected pairs split into hard / normal / easy.

Axis legend: K responses per row (2 pairs, 6 RM-Bench, 7 listwise; at most max_k),
M rubric items per list, n samples (AVG@n), R rows per file.

Workdir: report.json (config, per file and method the metrics, parse-failure and
invalid-item rates, wall time per 100 rows), trace.jsonl (one record per example, method
and sample), trace.html (readable static page).
"""
from __future__ import annotations

import html
import json
import math
import os
import time
import zlib

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/eval_evaluator.py",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
flags.mark_flags_as_required(["config", "workdir"])

RUBRIC_METHODS = ("dynamic", "static")
PAIRWISE_VARIANTS = ("direct_pairwise_ab", "direct_pairwise_ba", "direct_pairwise_avg")


# ----------------------------------------------------------------------------- models


_LOADED: dict = {}  # (source, dtype) -> (cfg, params, tokenizer), reused within a process


def load_role(source: str, dtype: str):
    """(cfg, params, tokenizer) of a model source; a source is loaded once per process, so
    a generator and a verifier from the same source share one parameter set.

    "tiny" is the TINY preset with random weights (PRNGKey(0)) and the SmolLM2 tokenizer.
    """
    cache = _LOADED
    if (source, dtype) in cache:
        return cache[(source, dtype)]
    import jax

    from drubric_jax import models
    from drubric_jax import tokenizer as tok_lib
    from drubric_jax.models import config as cfg_lib

    if source == "tiny":
        cfg = cfg_lib.TINY.replace(dtype=dtype, param_dtype=dtype)
        params = models.init_params(cfg, jax.random.PRNGKey(0))
        tok = tok_lib.tokenizer_from_gguf(models.default_gguf_path())
        cache[(source, dtype)] = (cfg, params, tok)
    else:
        cache[(source, dtype)] = models.load_model(source, dtype)
    return cache[(source, dtype)]


# ----------------------------------------------------------------------------- rows


class Row:
    """One evaluated example: a data Record cut to at most max_k responses."""

    def __init__(self, rec, max_k: int):
        import numpy as np

        from drubric_jax import data

        self.rec = rec
        k = len(rec.responses)
        if k < 2:
            raise ValueError(f"{rec.path}:{rec.line}: field 'responses' needs >= 2 responses "
                             f"to evaluate an evaluator, got {k}")
        keep = list(range(k))
        if max_k and k > max_k:
            rng = np.random.default_rng(zlib.crc32(rec.id.encode()))
            keep = sorted(rng.choice(k, max_k, replace=False).tolist())
        self.keep = keep
        ranks = data.gold_ranks(rec)
        self.gold = [ranks[i] for i in keep]
        self.responses = [rec.responses[i] for i in keep]
        labels, styles = rec.meta.get("label"), rec.meta.get("style")
        self.rm_bench = (isinstance(labels, list) and isinstance(styles, list)
                         and len(labels) == len(styles) == k)
        self.labels = [labels[i] for i in keep] if self.rm_bench else None
        self.styles = [styles[i] for i in keep] if self.rm_bench else None

    @property
    def k(self) -> int:
        return len(self.responses)


def load_rows(path: str, max_rows: int, max_k: int) -> list:
    """Rows of one file (data.load_jsonl validates and names file:line:field on errors)."""
    from drubric_jax import data

    records = data.load_jsonl(path)
    if max_rows:
        records = records[:max_rows]
    return [Row(r, max_k) for r in records]


# ----------------------------------------------------------------------------- judges


def fitted_ids(verifier, make_messages, texts, max_tokens):
    """Token ids of a judge prompt with its texts cut to `max_tokens` (fit_to_budget)."""
    from drubric_jax.text.budget import fit_to_budget

    def build(t):
        return verifier.tokenizer.encode(verifier.render(make_messages(t)),
                                         add_special_tokens=False)

    ids, _, cut = fit_to_budget(verifier.tokenizer, build, texts, max_tokens)
    return ids, any(cut)


def direct_scores(verifier, rows, max_tokens, with_set: bool):
    """P(yes) per response of the pointwise judge (optionally shown the set), per row."""
    from drubric_jax.text.prompts import direct_judge_messages

    prompts, spans = [], []
    for row in rows:
        hist = row.rec.history
        nh = len(hist)
        start = len(prompts)
        for i in range(row.k):
            def make(t, i=i, nh=nh, hist=hist, k=row.k):
                h = [dict(x, content=c) for x, c in zip(hist, t[1:1 + nh])]
                rs = t[1 + nh:1 + nh + k] if with_set else None
                return direct_judge_messages(t[0], t[-1], h, rs)

            texts = ([row.rec.prompt] + [x["content"] for x in hist]
                     + (row.responses if with_set else []) + [row.responses[i]])
            prompts.append(fitted_ids(verifier, make, texts, max_tokens)[0])
        spans.append((start, len(prompts)))
    p = verifier.p_yes_ids(prompts)
    return [p[a:b] for a, b in spans]


def pairwise_scores(verifier, rows, max_tokens):
    """(P(yes | A=resp0, B=resp1), P(yes | A=resp1, B=resp0)) per pair row, else None."""
    from drubric_jax.text.prompts import pairwise_judge_messages

    prompts, where = [], []
    for j, row in enumerate(rows):
        if row.k != 2:
            continue
        hist = row.rec.history
        nh = len(hist)
        for a, b in ((0, 1), (1, 0)):
            def make(t, nh=nh, hist=hist):
                h = [dict(x, content=c) for x, c in zip(hist, t[1:1 + nh])]
                return pairwise_judge_messages(t[0], t[-2], t[-1], h)

            texts = ([row.rec.prompt] + [x["content"] for x in hist]
                     + [row.responses[a], row.responses[b]])
            prompts.append(fitted_ids(verifier, make, texts, max_tokens)[0])
        where.append(j)
    out = [None] * len(rows)
    if prompts:
        p = verifier.p_yes_ids(prompts)
        for n, j in enumerate(where):
            out[j] = (float(p[2 * n]), float(p[2 * n + 1]))
    return out


# ----------------------------------------------------------------------------- metrics


def sample_metrics(rows, scores):
    """Metrics of one sample: scores[i] float[K_i] for rows[i] (METHOD 7, 11).

    Returns a dict of floats (and RM-Bench splits when every row is an RM-Bench row).
    """
    import numpy as np

    from drubric_jax import metrics, rewards

    n = len(rows)
    kmax = max(r.k for r in rows)
    s = np.zeros((n, kmax), np.float32)
    g = np.zeros((n, kmax), np.float32)
    m = np.zeros((n, kmax), bool)
    for i, (row, sc) in enumerate(zip(rows, scores)):
        s[i, :row.k] = sc
        g[i, :row.k] = row.gold
        m[i, :row.k] = True
    pw = {k: float(v) for k, v in metrics.pairwise_accuracy(s, g, m).items()}
    distinct = np.array([len(set(r.gold)) > 1 for r in rows])
    top1 = np.asarray(metrics.strict_top1(s, g, m))
    nd, nd_valid = (np.asarray(x) for x in metrics.ndcg(s, g, m))
    gap, cnt = (np.asarray(x) for x in rewards.delta_gap(s, g, m))
    out = {
        "strict_acc": pw["strict"], "acc_ties_excluded": pw["ties_excluded"],
        "tie_rate": pw["tie_rate"], "n_pairs": pw["n_pairs"],
        "top1": float(top1[distinct].mean()) if distinct.any() else 0.0,
        "ndcg": float(nd[nd_valid].mean()) if nd_valid.any() else 0.0,
        "delta_gap": float((gap * cnt).sum() / max(cnt.sum(), 1)),
    }
    if all(r.rm_bench for r in rows):
        rb = metrics.rm_bench_accuracy(scores, [r.labels for r in rows],
                                       [r.styles for r in rows])
        for name in ("hard", "normal", "easy", "all"):
            out[f"rmbench_{name}"] = float(rb[name])
    return out


def aggregate(per_sample: list) -> dict:
    """{metric: {"mean", "std", "per_sample"}} over the n samples (std ddof=1 when n > 1)."""
    import numpy as np

    out = {}
    for key in per_sample[0]:
        vals = np.array([d[key] for d in per_sample], np.float64)
        std = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
        out[key] = {"mean": float(vals.mean()), "std": std,
                    "per_sample": [float(v) for v in vals]}
    return out


# ----------------------------------------------------------------------------- one file


class FileRun:
    """Evaluates every method on one file; accumulates scores, traces, counters, timings."""

    def __init__(self, config, generator, verifier, path: str, file_index: int):
        self.c, self.gen, self.ver, self.path = config, generator, verifier, path
        self.methods = [m.strip() for m in config.methods.split(",") if m.strip()]
        self.n = config.n_samples
        self.file_index = file_index
        self.scores = {}      # method -> [sample][row] float[K]
        self.traces = []      # trace.jsonl records
        self.html_rows = []   # (row, {method: [per-sample dicts]})
        self.counters = {m: {} for m in RUBRIC_METHODS}
        self.timing = {}
        self.pairwise = []

    def _tick(self, name, t0):
        self.timing[name] = self.timing.get(name, 0.0) + time.time() - t0

    def run(self, rows) -> None:
        import jax
        from tqdm import tqdm

        key = jax.random.fold_in(jax.random.PRNGKey(self.c.seed), self.file_index)
        bar = tqdm(total=len(rows), desc=os.path.basename(self.path), unit="row",
                   disable=not self.c.progress)
        for start in range(0, len(rows), self.c.rows_per_batch):
            batch = rows[start:start + self.c.rows_per_batch]
            self._run_batch(jax.random.fold_in(key, start), start, batch)
            bar.update(len(batch))
        bar.close()

    def _run_batch(self, key, offset, rows) -> None:
        import jax
        import numpy as np

        from drubric_jax import rewards
        from drubric_jax.rubrics import RubricInput
        from drubric_jax.verification import verdicts_from_p_yes

        per_row = [dict() for _ in rows]
        rubric_methods = [m for m in self.methods if m in RUBRIC_METHODS]
        lists = {}
        for mi, method in enumerate(rubric_methods):
            t0 = time.time()
            inputs = [RubricInput(r.rec.prompt, tuple(r.responses), tuple(r.rec.history))
                      for r in rows]
            lists[method] = self.gen.generate_batch(
                jax.random.fold_in(key, 1 + mi), inputs, num_lists=self.n,
                temperature=self.c.temperature, static=(method == "static"))
            for name, v in lists[method].counters.items():
                self.counters[method][name] = self.counters[method].get(name, 0) + v
            self._tick(f"generator_{method}", t0)
        if rubric_methods:
            t0 = time.time()
            prompts, resps, items, hists, columns = [], [], [], [], []
            for j, r in enumerate(rows):
                # P(yes) depends only on (response, item text): score each distinct text of
                # the row once, for every method and sample.
                uniq = {}
                for m in rubric_methods:
                    for s in range(self.n):
                        for t in lists[m].texts[j][s]:
                            if t.strip():
                                uniq.setdefault(t.strip(), len(uniq))
                columns.append(uniq)
                for y in r.responses:
                    prompts.append(r.rec.prompt)
                    resps.append(y)
                    items.append(list(uniq))
                    hists.append(r.rec.history)
            p_all = self.ver.p_yes(prompts, resps, items, hists)
            self._tick("verifier", t0)
            at = 0
            for j, r in enumerate(rows):
                p_row = p_all[at:at + r.k]
                at += r.k
                for m in rubric_methods:
                    samples = []
                    for s in range(self.n):
                        lst = lists[m]
                        w, mask = lst.weights[j, s], lst.item_mask[j, s]
                        p = np.zeros((r.k, len(w)), np.float32)
                        for col, t in enumerate(lst.texts[j][s]):
                            if t.strip():
                                p[:, col] = p_row[:, columns[j][t.strip()]]
                        v = verdicts_from_p_yes(p)
                        sc, _ = rewards.rubric_scores(v, w, mask)
                        soft, _ = rewards.rubric_scores(p, w, mask)
                        samples.append({
                            "scores": np.asarray(sc, np.float64),
                            "soft_scores": np.asarray(soft, np.float64),
                            "order": lst.orders[j, s, :r.k].tolist(),
                            "items": [[t, int(wt)] for t, wt, ok in
                                      zip(lst.texts[j][s], w, mask) if ok],
                            "p_yes": p[:, :int(mask.sum())].round(4).tolist(),
                            "verdicts": v[:, :int(mask.sum())].astype(int).tolist(),
                            "valid": bool(lst.list_valid[j, s]),
                            "finish_reason": lst.finish_reasons[j][s],
                            "raw_text": lst.raw_texts[j][s],
                            "responses_cut": lst.response_cut[j, s, :r.k].tolist(),
                        })
                    per_row[j][m] = samples
        for name, with_set in (("direct", False), ("direct_set", True)):
            if name not in self.methods:
                continue
            t0 = time.time()
            ps = direct_scores(self.ver, rows, self.c.judge_max_tokens, with_set)
            for j in range(len(rows)):
                one = {"scores": np.asarray(ps[j], np.float64), "p_yes": ps[j].round(4).tolist()}
                per_row[j][name] = [one] * self.n
            if name == "direct":
                pw = pairwise_scores(self.ver, rows, self.c.judge_max_tokens)
                for j, x in enumerate(pw):
                    if x is not None:
                        p_ab, p_ba = x
                        per_row[j]["direct"][0]["pairwise"] = {"p_ab": round(p_ab, 4),
                                                               "p_ba": round(p_ba, 4)}
                        self.pairwise.append((offset + j, p_ab, p_ba))
            self._tick(name, t0)
        if "random" in self.methods:
            for j, r in enumerate(rows):
                rk = jax.random.fold_in(jax.random.fold_in(
                    jax.random.PRNGKey(self.c.seed), zlib.crc32(r.rec.id.encode())), 7)
                per_row[j]["random"] = [
                    {"scores": np.asarray(jax.random.uniform(jax.random.fold_in(rk, s),
                                                             (r.k,)), np.float64)}
                    for s in range(self.n)]
        for j, r in enumerate(rows):
            for m in self.methods:
                for s, d in enumerate(per_row[j][m]):
                    self.scores.setdefault(m, [[] for _ in range(self.n)])[s].append(
                        d["scores"])
                    if "soft_scores" in d:
                        self.scores.setdefault(f"{m}_soft", [[] for _ in range(self.n)])[
                            s].append(d["soft_scores"])
                    rec = {"file": self.path, "id": r.rec.id, "line": r.rec.line,
                           "method": m, "sample": s, "gold_ranks": r.gold,
                           "kept_responses": r.keep,
                           **{k: (v.tolist() if hasattr(v, "tolist") else v)
                              for k, v in d.items()}}
                    self.traces.append(rec)
            if len(self.html_rows) < self.c.html_max_examples:
                self.html_rows.append((r, per_row[j]))

    def report(self, rows, wall: float) -> dict:
        """Per-method metrics of this file, rates and timings (report.json section)."""
        import numpy as np

        out = {"n_rows": len(rows), "wall_s": round(wall, 2),
               "s_per_100_rows": round(100 * wall / max(len(rows), 1), 2),
               "phase_s_per_100_rows": {k: round(100 * v / max(len(rows), 1), 2)
                                        for k, v in self.timing.items()},
               "methods": {}}
        for m in self.scores:
            entry = aggregate([sample_metrics(rows, self.scores[m][s]) for s in range(self.n)])
            if m.endswith("_soft"):
                entry["note"] = ("diagnostic: Eq. 12 with P(yes) in place of the 0/1 verdict "
                                 "(not the method's score)")
            if m in RUBRIC_METHODS:
                c = self.counters[m]
                lists = max(c.get("lists", 0), 1)
                items = c.get("items_kept", 0) + c.get("items_dropped", 0)
                entry["parse_failure_rate"] = 1.0 - c.get("valid_lists", 0) / lists
                entry["invalid_item_rate"] = c.get("items_dropped", 0) / max(items, 1)
                entry["mean_items_per_list"] = c.get("items_kept", 0) / lists
                entry["counters"] = c
            out["methods"][m] = entry
        if self.pairwise:
            pair_rows = [rows[j] for j, _, _ in self.pairwise]
            p_ab = np.array([a for _, a, _ in self.pairwise])
            p_ba = np.array([b for _, _, b in self.pairwise])
            variants = {
                "direct_pairwise_ab": [(a, 1 - a) for a in p_ab],
                "direct_pairwise_ba": [(1 - b, b) for b in p_ba],
                "direct_pairwise_avg": [((a + 1 - b) / 2, (1 - a + b) / 2)
                                        for a, b in zip(p_ab, p_ba)],
            }
            for name, sc in variants.items():
                out["methods"][name] = aggregate([sample_metrics(pair_rows, sc)])
            out["methods"]["direct_pairwise_avg"]["first_position_win_rate"] = float(
                np.mean(np.concatenate([p_ab > 0.5, p_ba > 0.5])))
        return out


# ----------------------------------------------------------------------------- outputs


def _cell_color(p: float, v: int) -> str:
    return "#c8e6c9" if v else ("#ffcdd2" if p < 0.25 else "#ffe0b2")


def _pre(text: str, limit: int = 4000) -> str:
    body = html.escape(text[:limit]) + (html.escape(f" ... [{len(text) - limit} more chars]")
                                        if len(text) > limit else "")
    return f"<pre>{body}</pre>"


def write_html(path: str, sections: list) -> None:
    """trace.html: per example the prompt, responses, rubric grids, scores and gold ranks."""
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
                    if s and m not in RUBRIC_METHODS:
                        break
                    parts.append(f"<h4>{html.escape(m)} sample {s}</h4>")
                    parts.append(_grid(row, d, m))
            parts.append("</div>")
    parts.append("</body></html>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))


def _grid(row, d, method) -> str:
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
    cells = "".join(f"<td><b>{float(x):.3f}</b></td>" for x in d["scores"])
    out.append(f"<tr><td><b>score</b></td><td></td>{cells}</tr></table>")
    return "".join(out)


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if hasattr(x, "tolist"):
        return _jsonable(x.tolist())
    return x


def evaluate(config, workdir: str) -> dict:
    """Runs every configured method on every data file; writes the workdir outputs.

    Returns:
        the report dict (also written to workdir/report.json).

    Raises:
        ValueError: a bad config field, or a data row with a bad field (file:line:field).
    """
    from configs.eval_evaluator import validate
    from drubric_jax.rubrics import RubricGenerator
    from drubric_jax.verification import Verifier

    validate(config)
    if config.jax_cache_dir:
        import jax

        jax.config.update("jax_compilation_cache_dir", config.jax_cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    os.makedirs(workdir, exist_ok=True)
    paths = [p.strip() for p in config.data.split(",") if p.strip()]
    all_rows = [load_rows(p, config.max_rows, config.max_k) for p in paths]  # fail early
    t_start = time.time()
    gcfg, gparams, gtok = load_role(config.generator_model, config.dtype)
    vcfg, vparams, vtok = load_role(config.verifier_model, config.dtype)
    generator = RubricGenerator(gparams, gcfg, gtok, config.max_items, config.max_item_chars,
                                config.max_new_tokens, config.generator_input_budget)
    verifier = Verifier(vparams, vcfg, vtok, config.verifier_max_prefix_tokens,
                        config.verifier_max_suffix_tokens)
    load_s = time.time() - t_start
    report = {"config": config.to_dict(), "model_load_s": round(load_s, 2), "files": {}}
    sections = []
    with open(os.path.join(workdir, "trace.jsonl"), "w", encoding="utf-8") as trace:
        for index, (path, rows) in enumerate(zip(paths, all_rows)):
            t0 = time.time()
            run = FileRun(config, generator, verifier, path, index)
            run.run(rows)
            report["files"][path] = run.report(rows, time.time() - t0)
            for rec in run.traces:
                trace.write(json.dumps(_jsonable(rec), ensure_ascii=False) + "\n")
            sections.append((path, run.html_rows))
            logging.info("%s: %s", path, json.dumps(_jsonable(
                {m: v.get("strict_acc", {}).get("mean")
                 for m, v in report["files"][path]["methods"].items()})))
    total_rows = sum(len(r) for r in all_rows)
    wall = time.time() - t_start
    report["wall_s"] = round(wall, 2)
    report["total_rows"] = total_rows
    report["s_per_100_rows"] = round(100 * wall / max(total_rows, 1), 2)
    report["verifier_stats"] = dict(verifier.stats)
    with open(os.path.join(workdir, "report.json"), "w", encoding="utf-8") as f:
        json.dump(_jsonable(report), f, indent=1)
    write_html(os.path.join(workdir, "trace.html"), sections)
    return report


def main(argv):
    del argv
    evaluate(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
