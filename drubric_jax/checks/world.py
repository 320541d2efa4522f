"""The checks world's prompts and anchor order (METHOD 13): seeded constraints for a base
prompt, the prompt text with them appended in the checkers' own words, and the order of
responses by gold score.

Constraints are drawn as IFEval built its prompts (Zhou et al. 2023, arXiv:2311.07911):
instruction ids that IFEval's registry lists as conflicting (`INSTRUCTION_CONFLICTS` of
`if_verifiable.ifeval.instructions_registry`, made symmetric by its `conflict_make`) never
share a prompt. On top of that table, pairs whose drawn arguments contradict each other
are refused (`_args_contradict`): a word both required and forbidden, a letter capped
("less than") that a required word contains, a case check against a case-sensitive
section marker, and a repeated prompt under no_comma (the no_comma sentence itself has a
comma).

Every random choice comes from the caller's `numpy.random.Generator`.
"""
from __future__ import annotations

import copy

import numpy as np
from if_verifiable.ifeval import instructions_registry

from drubric_jax.checks.draw import draw_args
from drubric_jax.checks.table import SCORABLE_CHECKS
from drubric_jax.checks.verify import render

REPEAT = "combination:repeat_prompt"
# Between the base prompt and the constraint sentences, and between sentences.
PROMPT_SEP, SENTENCE_SEP = "\n\n", "\n"

# {id: ids it may not share a prompt with (itself included)}, IFEval's table made symmetric.
CONFLICTS = instructions_registry.conflict_make(
    copy.deepcopy(instructions_registry.INSTRUCTION_CONFLICTS))


def _required_words(check: str, args: dict) -> list:
    """Strings a response must contain to meet (check, args), lower-cased."""
    if check == "keywords:existence":
        return [w.lower() for w in args["keywords"]]
    if check == "keywords:frequency" and args["relation"] == "at least":
        return [args["keyword"].lower()]
    if check == "length_constraints:nth_paragraph_first_word":
        return [args["first_word"].lower()]
    if check == "startend:end_checker":
        return [args["end_phrase"].lower()]
    if check == "detectable_content:postscript":
        return [args["postscript_marker"].lower()]
    if check == "detectable_format:multiple_sections":
        return [args["section_spliter"].lower()]
    return []


def _one_way(a: tuple, b: tuple) -> bool:
    (ca, aa), (cb, ab) = a, b
    if ca == "keywords:forbidden_words":
        banned = {w.lower() for w in aa["forbidden_words"]}
        # keywords:frequency "less than" a count still allows 0 uses, but a banned word that
        # must be counted is a contradiction in spirit: refused either way.
        counted = [ab["keyword"].lower()] if cb == "keywords:frequency" else []
        if banned & set(_required_words(cb, ab) + counted):
            return True
    if ca == "keywords:letter_frequency" and aa["let_relation"] == "less than":
        if any(aa["letter"].lower() in w for w in _required_words(cb, ab)):
            return True
    if cb == "detectable_format:multiple_sections":  # its marker is matched case-sensitively
        marker = ab["section_spliter"]
        if ca == "change_case:english_lowercase" and marker != marker.lower():
            return True
        if ca == "change_case:english_capital" and marker != marker.upper():
            return True
    return ca == REPEAT and cb == "punctuation:no_comma"


def compatible(a: tuple, b: tuple) -> bool:
    """Whether two drawn checks (check id, args) may share a prompt (module docstring)."""
    if b[0] in CONFLICTS.get(a[0], ()) or a[0] in CONFLICTS.get(b[0], ()):
        return False
    return not (_one_way(a, b) or _one_way(b, a))


def draw_constraints(base_prompt: str, rng: np.random.Generator, max_checks: int = 3,
                     pool=SCORABLE_CHECKS) -> list:
    """1..max_checks mutually compatible checks with drawn arguments for one base prompt.

    The count is uniform on 1..max_checks; each check is uniform over the ids of `pool`
    not yet used and compatible with those drawn (arguments drawn by `draw_args`; a draw
    whose arguments contradict an earlier check is redrawn, at most 20 times, then the id
    is skipped). `combination:repeat_prompt`, if drawn, is moved last and repeats the
    prompt text before it: the base prompt and the other constraints' sentences.

    Args:
        base_prompt: the instruction the constraints are attached to.
        rng: the only source of randomness.
        max_checks: the most constraints, >= 1.
        pool: the check ids to draw from (default: every scorable check).

    Returns:
        list of {"check": id, "args": {...}} in prompt order (>= 1 entry).

    Raises:
        ValueError: max_checks < 1 or an empty pool.
    """
    if max_checks < 1 or not pool:
        raise ValueError(f"max_checks must be >= 1 and pool non-empty, got {max_checks}, "
                         f"{len(pool)} ids")
    want = int(rng.integers(1, max_checks + 1))
    chosen = []  # (check, args)
    while len(chosen) < want:
        open_ids = [c for c in pool if all(
            c not in CONFLICTS.get(d, ()) and d not in CONFLICTS.get(c, ()) for d, _ in chosen)]
        if not open_ids:
            break
        check = open_ids[int(rng.integers(len(open_ids)))]
        for _ in range(20):
            args = draw_args(check, rng, prompt=base_prompt)
            if all(compatible((check, args), c) for c in chosen):
                chosen.append((check, args))
                break
        else:
            pool = [c for c in pool if c != check]  # no compatible arguments: not this id
    chosen.sort(key=lambda t: t[0] == REPEAT)  # stable: the repeat alone moves last
    if chosen[-1][0] == REPEAT:
        before = compose_prompt(base_prompt, [{"check": c, "args": a} for c, a in chosen[:-1]])
        chosen[-1] = (REPEAT, {"prompt_to_repeat": before})
    return [{"check": c, "args": a} for c, a in chosen]


def compose_prompt(base_prompt: str, true_checks) -> str:
    """The prompt x: the base prompt, PROMPT_SEP, then each check's rendered sentence
    (`verify.render`, the checker's own words) joined by SENTENCE_SEP; the base prompt
    alone when there are no checks.

    Raises:
        InvalidCheck: a check the checker cannot render.
    """
    sentences = [render(t["check"], t["args"]) for t in true_checks]
    if not sentences:
        return base_prompt
    return base_prompt.rstrip() + PROMPT_SEP + SENTENCE_SEP.join(sentences)


def rank_by_gold(scores) -> tuple:
    """The anchor order of responses by gold score, as the shared data schema writes it.

    Args:
        scores: float[A] gold scores, one per response (in response order).

    Returns:
        (ranking, ties): ranking int list, response indices best first (a stable sort:
        equal scores keep response order, as the schema's tied responses keep the source
        order); ties True when two responses have equal scores (the schema's `"ties"`, which
        makes `scores` decide equal ranks).
    """
    scores = [float(s) for s in scores]
    ranking = sorted(range(len(scores)), key=lambda i: -scores[i])
    return ranking, len(set(scores)) < len(scores)


def draw_from_pool(base_prompt: str, rng: np.random.Generator, pool, min_checks: int = 1,
                   max_checks: int = 1) -> list:
    """World v2: min_checks..max_checks mutually compatible checks from a calibrated pool of
    variants (`checks.pool.Variant`, `pool.load_pool`) for one base prompt.

    The count is uniform on min_checks..max_checks; each check is a variant uniform over
    the pool's variants whose id is not yet used and is compatible with those drawn (its
    arguments from `Variant.draw`; a draw whose arguments contradict an earlier check is
    redrawn, at most 20 times, then the variant is skipped). Fewer than the count are
    returned only when no compatible variant is left.

    Returns:
        list of {"check": id, "args": {...}} (>= 1 entry).

    Raises:
        ValueError: 1 <= min_checks <= max_checks does not hold, or an empty pool.
    """
    if not 1 <= min_checks <= max_checks or not pool:
        raise ValueError(f"need 1 <= min_checks <= max_checks and a non-empty pool, got "
                         f"{min_checks}, {max_checks}, {len(pool)} variants")
    want = int(rng.integers(min_checks, max_checks + 1))
    left, chosen = list(pool), []  # chosen: (check, args)
    while len(chosen) < want:
        used = {c for c, _ in chosen}
        open_v = [v for v in left if v.check not in used and all(
            v.check not in CONFLICTS.get(d, ()) and d not in CONFLICTS.get(v.check, ())
            for d, _ in chosen)]
        if not open_v:
            break
        v = open_v[int(rng.integers(len(open_v)))]
        for _ in range(20):
            args = v.draw(rng, prompt=base_prompt)
            if all(compatible((v.check, args), c) for c in chosen):
                chosen.append((v.check, args))
                break
        else:
            left.remove(v)
    return [{"check": c, "args": a} for c, a in chosen]
