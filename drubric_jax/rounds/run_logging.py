"""Run outputs: metrics.jsonl + TensorBoard events, per-round HTML traces, curves.png;
and the log filter that keeps third-party INFO lines out of a run's console.

Metric writing uses tensorboardX (event files) and plain JSON lines; plotting uses
matplotlib with the non-interactive Agg backend.
"""
from __future__ import annotations

import html
import json
import logging
import math
import os
from typing import Iterable, Sequence

import numpy as np
from etils import epath

from drubric_jax.data.schema import write_json  # noqa: F401 (the experiments call it here)


# Where this project's code lives: records from files under these folders pass the filter.
# This file is drubric_jax/rounds/run_logging.py: the repository root is three levels up.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_OWN_DIRS = tuple(os.path.join(_ROOT, d) + os.sep for d in ("drubric_jax", "experiments",
                                                            "configs"))


# IFEval's language checkers (package if_verifiable) log this ERROR, with the whole
# response, for each text langdetect cannot read (digits, symbols, an empty line), and
# count the text as following the instruction: IFEval's rule, kept. The verdict is in the
# metrics already; the line repeats thousands of times in a checks-world run.
_UNDETECTED_LANGUAGE = "Unable to detect language for text %s due to %s"


class ThirdPartyFilter(logging.Filter):
    """Drops log records below WARNING that come from other packages (Orbax writes about
    330 INFO lines around the progress bars of a default run, JAX its backend probes), and
    IFEval's undetected-language ERROR (see above); ours and every other warning pass.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        path = os.path.abspath(record.pathname)
        if record.msg == _UNDETECTED_LANGUAGE and f"{os.sep}if_verifiable{os.sep}" in path:
            return False
        return record.levelno >= logging.WARNING or path.startswith(_OWN_DIRS)


def quiet_third_party_logs(quiet: bool = True) -> None:
    """Installs (or, with quiet=False, removes) `ThirdPartyFilter` on the absl handler and
    on the root logger's handlers, where absl-logging libraries such as Orbax write."""
    from absl import logging as absl_logging

    handlers = [absl_logging.get_absl_handler()] + list(logging.getLogger().handlers)
    for handler in handlers:
        # Removed first, so a second call installs no second filter.
        for f in [f for f in handler.filters if isinstance(f, ThirdPartyFilter)]:
            handler.removeFilter(f)
        if quiet:
            handler.addFilter(ThirdPartyFilter())


def _scalar(v):
    # bool first: True is an int too.
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)) or (hasattr(v, "shape") and np.ndim(v) == 0):
        f = float(v)
        # NaN and inf are not valid JSON: written as the strings "nan", "inf".
        return f if math.isfinite(f) else str(f)
    if isinstance(v, (list, tuple)):
        return [_scalar(x) for x in v]
    if isinstance(v, dict):
        return {k: _scalar(x) for k, x in v.items()}
    # numpy and jax arrays become (nested) lists.
    if hasattr(v, "tolist"):
        return _scalar(v.tolist())
    return v


class MetricsWriter:
    """Appends one JSON object per step to `workdir/metrics.jsonl` and mirrors the numeric
    fields to TensorBoard event files under `workdir/tensorboard/`.

    The JSONL file is opened in append mode so a resumed run continues it; rows carry
    round/phase/step so duplicates from a crash between a log and a checkpoint can be told
    apart (the later row wins).
    """

    def __init__(self, workdir: str, tensorboard: bool = True, enabled: bool = True):
        self.path = epath.Path(workdir) / "metrics.jsonl"  # a local path or a URL
        self.enabled = enabled
        self._file = self._tb = None
        if not enabled:  # a process other than process 0 of a multi-process run
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Appending needs a filesystem that appends (local, NFS/Lustre, gcsfuse mounts).
        self._file = self.path.open("a")
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, global_step: int, row: dict) -> None:
        """Writes `row` (scalars, lists, nested dicts) for `global_step` (nothing when the
        writer is not enabled)."""
        if not self.enabled:
            return
        row = _scalar(row)
        self._file.write(json.dumps(row, sort_keys=True) + "\n")
        # Flushed per row: a killed run loses at most the row being written.
        self._file.flush()
        if self._tb is not None:
            # One TensorBoard group per phase: generator and policy curves apart.
            prefix = row.get("phase", "run")
            for k, v in row.items():
                # Numbers only: lists (weight_hist) stay in the JSONL.
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(f"{prefix}/{k}", v, global_step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str) -> list[dict]:
    """Rows of a metrics.jsonl, keeping the last row per (round, phase, step)."""
    rows = {}
    with epath.Path(path).open("r") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                # The last row wins: a row repeated after a crash and resume replaces the first.
                rows[(r.get("round"), r.get("phase"), r.get("step"), r.get("kind"))] = r
    return list(rows.values())


def plot_curves(metrics_path: str, out_png: str,
                keys: Sequence[str] = ("r_disc", "r_anchor", "policy_reward", "delta_gap")) -> None:
    """Plots the per-round mean of each key (one panel per key) to `out_png`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
    # atleast_1d: with one key, subplots returns a single Axes, not an array.
    for ax, key in zip(np.atleast_1d(axes), keys):
        by_round: dict = {}
        for r in rows:
            if isinstance(r.get(key), (int, float)):
                by_round.setdefault(r["round"], []).append(r[key])
        xs = sorted(by_round)
        ax.plot(xs, [np.mean(by_round[x]) for x in xs], marker="o")
        ax.set_title(key)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    with epath.Path(out_png).open("wb") as f:  # a local path or a URL
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)


def write_round_trace(path: str, title: str, examples: Iterable[dict]) -> None:
    """A static HTML page: per prompt, the responses, rubric items with weights, the
    verdict grid and the scores.

    Each example: {"prompt": str, "responses": [str] (K), "items": [str] (M),
    "weights": [int] (M), "verdicts": [[v] * M] * K with v 0/1 (hard) or P(yes) (soft),
    "scores": [float] (K), "valid": bool}; items, weights and verdicts may be left out (a
    rule reward). Cells show yes / no, or the soft verdict.
    """
    def cell(v):
        # Hard verdicts read yes / no, soft ones show P(yes).
        label = ("yes" if v else "no") if v in (0, 1) else f"{v:.2f}"
        # Green above 0.5, the threshold of a hard verdict.
        return f"<td class='{'y' if v > 0.5 else 'n'}'>{label}</td>"

    esc = html.escape
    parts = [f"<!doctype html><meta charset='utf-8'><title>{esc(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}"
             "pre{white-space:pre-wrap;background:#f6f6f6;padding:6px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}"
             "table{border-collapse:collapse}.y{background:#cfc}.n{background:#fcc}</style>",
             f"<h1>{esc(title)}</h1>"]
    for i, ex in enumerate(examples):
        parts.append(f"<h2>Prompt {i + 1}</h2><pre>{esc(ex['prompt'])}</pre>")
        if not ex.get("valid", True):
            parts.append("<p><b>rubric list invalid</b>: every score is 0 (METHOD section 11)</p>")
        head = "".join(f"<th>R{k + 1}</th>" for k in range(len(ex["responses"])))
        parts.append(f"<table><tr><th>item</th><th>w</th>{head}</tr>")
        # A rule-reward step (plain GRPO) has scores but no rubric items.
        for m, (item, w) in enumerate(zip(ex.get("items", []), ex.get("weights", []))):
            cells = "".join(cell(ex["verdicts"][k][m]) for k in range(len(ex["responses"])))
            parts.append(f"<tr><td>{esc(item)}</td><td>{w}</td>{cells}</tr>")
        scores = "".join(f"<td>{s:.3f}</td>" for s in ex["scores"])
        parts.append(f"<tr><th colspan=2>score E (Eq. 12)</th>{scores}</tr></table>")
        for k, r in enumerate(ex["responses"]):
            parts.append(f"<h3>R{k + 1} (score {ex['scores'][k]:.3f})</h3><pre>{esc(r)}</pre>")
    path = epath.Path(path)  # a local path or a URL
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), encoding="utf-8")


WALL_FILE = "wall_s.json"


def wall_times(workdir: str) -> dict:
    """{stage: seconds} an experiment's commands have spent on its finished stages, read
    from `<workdir>/wall_s.json` ({} when absent)."""
    path = epath.Path(workdir) / WALL_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def add_wall_time(workdir: str, stage: str, seconds: float) -> dict:
    """Adds `seconds` to `stage` in `<workdir>/wall_s.json` (written to a temporary file and
    renamed) and returns the whole dict. Experiments call it when a stage ends, so a
    command killed later keeps the times of the stages it finished; the time a killed
    stage had spent is lost, and its resumed run counts from its restart. Under several
    processes (`jax.distributed`) only process 0 writes; the others return the sum."""
    import jax

    wall = wall_times(workdir)
    wall[stage] = wall.get(stage, 0.0) + float(seconds)
    if jax.process_index() != 0:  # one writer of a shared workdir (as metrics.jsonl)
        return wall
    write_json(epath.Path(workdir) / WALL_FILE, wall)
    return wall
