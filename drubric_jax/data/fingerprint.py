"""Data fingerprint: which rows a run used, so a resumed workdir can refuse other data.

The hash covers the rows as the run uses them (after filters, caps and response cuts),
not the files' bytes: editing a row that a filter drops, or moving the data directory,
leaves it unchanged; editing a used row or a cap changes it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Sequence

from drubric_jax.data.schema import AnchorList, PromptItem


def _row_bytes(row) -> bytes:
    """Canonical JSON of one dataclass row (AnchorList, PromptItem): sorted keys, no
    spaces, UTF-8, so equal rows give equal bytes on every machine."""
    fields = dataclasses.asdict(row)
    if isinstance(row, PromptItem) and not fields["meta"]:
        # A prompt row without meta hashes as before PromptItem carried meta, so the runs
        # fingerprinted then still resume.
        del fields["meta"]
    if isinstance(row, AnchorList):
        # An anchor list's meta trains nothing (its true checks only score the generator's
        # constraint recovery), and anchor rows with meta were hashed without it before
        # AnchorList carried it: left out, so those runs still resume.
        del fields["meta"]
    return json.dumps(fields, sort_keys=True, ensure_ascii=False,
                      separators=(",", ":")).encode("utf-8")


def data_fingerprint(paths_and_rows: Sequence[tuple]) -> dict:
    """Paths, row counts and content hashes of the rows a run reads.

    Args:
      paths_and_rows: (kind, path, rows) per file in reading order; kind is "anchors" or
        "prompts", rows the dataclass rows used from that file (AnchorList / PromptItem).

    Returns:
      JSON-serialisable dict {"files": [{"kind", "path", "rows", "sha256"}, ...],
      "rows": {kind: total rows}, "sha256": hex digest over every file's kind and sha256 in
      order}. Paths are listed but not hashed: the same rows read from another directory
      give the same top-level "sha256".
    """
    files, rows_per_kind = [], {}
    top = hashlib.sha256()
    for kind, path, rows in paths_and_rows:
        h = hashlib.sha256()
        for row in rows:
            # A separator after each row: moving a row boundary changes the hash.
            h.update(_row_bytes(row) + b"\n")
        files.append({"kind": kind, "path": str(path), "rows": len(rows),
                      "sha256": h.hexdigest()})
        rows_per_kind[kind] = rows_per_kind.get(kind, 0) + len(rows)
        # Kind and content only, in reading order; the path is listed but never hashed.
        top.update(f"{kind}:{h.hexdigest()}\n".encode("ascii"))
    return {"files": files, "rows": rows_per_kind, "sha256": top.hexdigest()}
