"""Verdicts from the verifier's answer logits (METHOD 11, 12; Eq. 12-15 take them).

    P(yes) = sum_{t in YES} p(t) / (sum_{t in YES} p(t) + sum_{t in NO} p(t))

YES / NO are all single-token spellings of the words in the tokenizer (" yes", "Yes",
" Yes", "YES", ...; case-14). This module is the one place that turns P(yes) into a
verdict v, in one of two modes (`config.verifier.verdict`):
    hard   v = 1 iff P(yes) > 0.5 (the paper; METHOD 11)
    soft   v = P(yes) in [0, 1] (METHOD 12: a weak verifier's probabilities still order
           responses when every thresholded verdict is 0)
and, optionally first, contextual calibration (`config.verifier.calibration`; Zhao et al.
2021, "Calibrate Before Use"): P_cal = sigmoid(logit P(yes | x, y) - logit P(yes | x, y_null))
with the content-free response y_null = NULL_RESPONSE, per item and prompt.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

YES_WORD = "yes"
NO_WORD = "no"
# Values of config.verifier.verdict (hard: METHOD 11, soft: METHOD 12) and of
# config.verifier.calibration (none, or METHOD 12's contextual calibration).
VERDICT_MODES = ("hard", "soft")
CALIBRATIONS = ("none", "contextual")
NULL_RESPONSE = "N/A"  # the content-free response of contextual calibration
_VARIANT_PREFIXES = ("", " ")  # leading-space and bare forms (chat templates use both)


def yes_no_token_ids(tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Single-token spellings of "yes" and "no" in a tokenizer (METHOD 11, case-14).

    Candidates are the lower / Capitalised / UPPER forms with and without a leading space
    ("yes", "Yes", "YES", " yes", " Yes", " YES"; same for "no"). A candidate counts when
    it encodes to exactly one token whose decoded text, stripped and lower-cased, is the
    word. Nothing is hard-coded: a different tokenizer gives its own ids.

    Args:
        tokenizer: a Hugging Face tokenizer (`encode`, `decode`).

    Returns:
        (yes_ids int32[n_yes], no_ids int32[n_no]), sorted, without duplicates.

    Raises:
        ValueError: no single-token spelling of "yes" or of "no" exists, or the sets overlap.
    """
    found = {}
    for word in (YES_WORD, NO_WORD):
        ids = set()
        for form in (word, word.capitalize(), word.upper()):
            for prefix in _VARIANT_PREFIXES:
                enc = tokenizer.encode(prefix + form, add_special_tokens=False)
                # Single tokens only: the answer is read at one position, where a
                # multi-token spelling has no probability of its own.
                if len(enc) == 1 and tokenizer.decode(enc).strip().lower() == word:
                    ids.add(int(enc[0]))
        if not ids:
            raise ValueError(f"the tokenizer has no single-token spelling of {word!r}")
        found[word] = np.array(sorted(ids), np.int32)
    if set(found[YES_WORD].tolist()) & set(found[NO_WORD].tolist()):
        raise ValueError("yes and no token sets overlap")
    return found[YES_WORD], found[NO_WORD]


def p_yes_from_logits(logits: jax.Array, yes_ids: jax.Array, no_ids: jax.Array) -> jax.Array:
    """P(yes) from next-token logits, summing every yes and no variant (METHOD 11; the
    verdict it gives is v_m(y) of Eq. 12-13).

        P(yes) = sum_yes exp(l) / (sum_yes exp(l) + sum_no exp(l))
               = sigmoid(logsumexp(l[YES]) - logsumexp(l[NO]))

    The softmax normaliser over the vocabulary cancels, so mass on other tokens does not
    matter (case-14: Yes .30 + " Yes" .25 vs No .40 + " no" .05 gives 0.55).

    Args:
        logits: float32[..., V].
        yes_ids: int32[n_yes]; no_ids: int32[n_no] (from `yes_no_token_ids`).

    Returns:
        float32[...] in [0, 1].
    """
    logits = jnp.asarray(logits, jnp.float32)
    lse_yes = jax.nn.logsumexp(jnp.take(logits, yes_ids, axis=-1), axis=-1)
    lse_no = jax.nn.logsumexp(jnp.take(logits, no_ids, axis=-1), axis=-1)
    # The logsumexp form stays accurate when both masses would underflow as probabilities.
    return jax.nn.sigmoid(lse_yes - lse_no)


def verdicts_from_p_yes(p_yes, mode: str = "hard") -> np.ndarray:
    """The verdicts v of Eq. 12-13 from P(yes) (already calibrated, when asked).

    Args:
        p_yes: float[...].
        mode: "hard": v = 1 iff P(yes) > 0.5 (METHOD 11; exactly 0.5 is No); "soft":
            v = P(yes) (METHOD 12).

    Returns:
        float32[...] (the dtype `rewards.rubric_scores` takes, Eq. 12).

    Raises:
        ValueError: an unknown mode.
    """
    p = np.asarray(p_yes, np.float32)
    if mode == "hard":
        return (p > 0.5).astype(np.float32)
    if mode == "soft":
        return p
    raise ValueError(f"verdict mode must be one of {VERDICT_MODES}, got {mode!r}")


def contextual_calibration(p_yes, p_null) -> np.ndarray:
    """sigmoid(logit P(yes | x, y) - logit P(yes | x, y_null)) (METHOD 12; Zhao et al. 2021).

    A verifier that leans to "no" for every response of an item is re-centred on what it
    says for the content-free response: an item it answers as it does for "N/A" gets 0.5.

    Args:
        p_yes: float[...] P(yes) of (x, y, item).
        p_null: float[...] P(yes) of (x, NULL_RESPONSE, item), broadcastable to p_yes.

    Returns:
        float32[...] in [0, 1], computed in float64 from logits clipped to P in
        [1e-7, 1 - 1e-7] (a verifier certain of its answer stays finite).
    """
    def logit(p):
        p = np.clip(np.asarray(p, np.float64), 1e-7, 1 - 1e-7)
        return np.log(p) - np.log1p(-p)

    return (1.0 / (1.0 + np.exp(-(logit(p_yes) - logit(p_null))))).astype(np.float32)
