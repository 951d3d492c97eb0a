"""Verifiable rewards: answer extraction, math equivalence, format checks, composition.

The functions follow the reward section of the seed tutorial: `math_reward`
scores the last `\\boxed{}` answer (-1 none, 0 wrong, 1 right) and
`format_reward` gives +0.3 to a well-formed completion and -0.2 otherwise.
`combine` forms `total = sum_k w_k * part_k`, as in
`correctness * 1.0 + format * 0.1`.

Equivalence is judged by math-verify (sympy), so `0.5`, `1/2` and `\\frac{1}{2}`
agree. math-verify guards slow comparisons with `signal.alarm`, which works only
on the main thread; elsewhere we pass `timeout=None` and instead refuse, before
comparing, answers whose evaluation could explode (see `_bounded`). math-verify
itself (with `raise_on_error=False`, its default) turns unparseable input into
an empty parse and a False comparison, so nothing here catches exceptions: an
exception from a reward is a bug and propagates. Its warning that the timeout is off
("you must provide the logic for timeout interruption yourself") is that logic's very
case, so a filter on its loggers drops that one message.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
import threading
from collections.abc import Collection, Mapping, Sequence
from types import MappingProxyType
from typing import Literal, get_args

import sympy
from math_verify import parse, verify
from sympy.functions.combinatorial.factorials import CombinatorialFunction

from agentgym.text import BOXED, boxes, extract_boxed

Format = Literal["react", "json", "boxed"]
FORMATS: tuple[str, ...] = get_args(Format)

_REACT_THOUGHT = re.compile(r"^\s*Thought:", re.MULTILINE)
_REACT_ACTION = re.compile(r"^\s*Action:", re.MULTILINE)
_TIMEOUT_S = 2  # math-verify's signal alarm, in whole seconds; only on the main thread
_MAX_ANSWER_CHARS = 1000  # longer "answers" are not answers; never parsed
_WORDS = re.compile(r"[^\W\d_]+(?:[\s'’.,-]+[^\W\d_]+)*\.?")
"""Letters only (a name, yes/no, a city): text, compared as text, not as math-verify reads
it (a product of symbols, so `no` = `on` and `abc` = `cba`)."""
_MAX_DIGITS = 10_000  # bound on the digits of a power in a predicted answer
_MAX_FACTORIAL_ARG = 10_000


class _TimeoutOffNotice(logging.Filter):
    """Drops math-verify's warning that its timeout is off: `_bounded` is what stands in."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_TimeoutOffNotice())


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@functools.lru_cache(maxsize=8192)
def _parse(answer: str, timeout: int | None) -> tuple:
    """math-verify's parse of one bare answer (sympy objects and/or strings)."""
    return tuple(parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout))


def _magnitude(expr: sympy.Basic) -> float:
    """|expr| as a float (inf or nan when it has no finite numeric value)."""
    value = abs(sympy.N(expr))
    return float(value) if value.is_Number else math.inf


def _bounded(expr: object) -> bool:
    """Whether evaluating `expr` exactly stays cheap: no huge powers or factorials.

    Off the main thread there is no timeout, and sympy would happily try to
    compute `9^{9^{9^9}}`. Sub-terms are checked first, so each `sympy.N` call
    here is on a term already known to be small. A predicted answer that fails
    this is never equal to anything.
    """
    if not isinstance(expr, sympy.Basic):
        return True
    if not all(_bounded(arg) for arg in expr.args):
        return False
    if expr.free_symbols:
        return True
    if isinstance(expr, sympy.Pow):
        base = _magnitude(expr.base)
        digits = abs(math.log10(base)) if base > 0 else 0.0
        return digits * _magnitude(expr.exp) <= _MAX_DIGITS  # False for nan
    if isinstance(expr, CombinatorialFunction):
        return all(_magnitude(arg) <= _MAX_FACTORIAL_ARG for arg in expr.args)
    return True


def answers_equal(predicted: str, expected: str) -> bool:
    """Whether two final answers are mathematically equivalent, per math-verify.

    `0.5`, `1/2`, `\\frac{1}{2}` agree, as do `3` and `3.0`. Words (letters only, a name or
    yes/no) are compared as text, case-blind: `Paris` = `paris`, but `no` != `on`. Garbage
    gives False, never an exception. Works off the main thread (see the module docstring).
    """
    predicted, expected = predicted.strip(), expected.strip()
    if predicted == expected:
        return bool(predicted)
    if not predicted or len(predicted) > _MAX_ANSWER_CHARS:
        return False
    if _WORDS.fullmatch(predicted) or _WORDS.fullmatch(expected):  # words: text equality
        return _as_text(predicted) == _as_text(expected)
    timeout = _TIMEOUT_S if _on_main_thread() else None
    target = _parse(predicted, timeout)
    gold = _parse(expected, timeout)
    if not target or not gold or not all(_bounded(t) for t in target):
        return False
    return verify(list(gold), list(target), timeout_seconds=timeout)


def _as_text(answer: str) -> str:
    """A word answer compared case- and spacing-blind, a final full stop dropped."""
    return " ".join(answer.rstrip(".").split()).casefold()


def math_reward(completion: str, expected_answer: str) -> float:
    """The tutorial's math reward: -1.0 without a boxed answer, 1.0 if right, else 0.0."""
    extracted = extract_boxed(completion)
    if extracted is None:
        return -1.0
    return 1.0 if answers_equal(extracted, expected_answer) else 0.0


def has_react_format(text: str) -> bool:
    """Whether `text` has a `Thought:` line followed later by an `Action:` line."""
    thought = _REACT_THOUGHT.search(text)
    return thought is not None and _REACT_ACTION.search(text, thought.end()) is not None


def has_json_object(text: str) -> bool:
    """Whether `text` contains a non-empty JSON object (e.g. a tool call)."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            value = None  # not JSON at this brace (LaTeX, prose); try the next one
        if isinstance(value, dict) and value:
            return True
        start = text.find("{", start + 1)
    return False


def has_boxed_final_answer(text: str) -> bool:
    """Whether `text` ends its reasoning with exactly one `\\boxed{}` answer.

    "Ends" means the box is on the last non-blank line, so "The answer is
    \\boxed{4}." and "$\\boxed{4}$" count, but a box followed by more reasoning
    does not. Several boxes (hedging) or an unbalanced one do not count.
    """
    found = boxes(text)
    if found is None or len(found) != 1:
        return False
    last_match = list(BOXED.finditer(text))[-1]
    return "\n" not in text[last_match.end() :].strip()


_FORMAT_CHECKS = {
    "react": has_react_format,
    "json": has_json_object,
    "boxed": has_boxed_final_answer,
}


def format_reward(completion: str, formats: Collection[Format] = ("react", "json")) -> float:
    """The tutorial's format reward: 0.3 if the completion is well-formed, else -0.2.

    The default, ReAct (`Thought:` / `Action:` lines) or a JSON object, is the
    tutorial's function. It predates the math environment, for which the
    well-formed output is reasoning ended by one boxed answer: pass
    `formats=("boxed",)` there. Any one listed format suffices.
    """
    unknown = [f for f in formats if f not in _FORMAT_CHECKS]
    if unknown or not formats:
        raise ValueError(f"formats={tuple(formats)!r}; valid: a non-empty subset of {FORMATS}")
    return 0.3 if any(_FORMAT_CHECKS[f](completion) for f in formats) else -0.2


def combine(parts: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """The weighted total `sum_k weights[k] * parts[k]` over the weighted parts.

    Parts without a weight are left out (they may be logged only). A weight
    whose part is missing is a configuration error: ValueError names it.
    """
    missing = [key for key in weights if key not in parts]
    if missing:
        raise ValueError(f"reward weight(s) {missing} have no reward part; parts: {sorted(parts)}")
    return float(sum(w * parts[key] for key, w in weights.items()))


def check_weights(
    weights: Mapping[str, float] | None, parts: Sequence[str], default: Mapping[str, float]
) -> Mapping[str, float]:
    """Reward weights, checked: every key one of `parts`, every value a finite number;
    `default` for None. ValueError naming the key and what is valid otherwise."""
    if weights is None:
        return default
    for key, value in weights.items():
        if key not in parts:
            raise ValueError(f"reward_weights has unknown part {key!r}; valid: {', '.join(parts)}")
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ValueError(f"reward_weights[{key!r}]={value!r}; valid: a finite number")
    return MappingProxyType({k: float(v) for k, v in weights.items()})
