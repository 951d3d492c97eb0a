"""Judges: whether a final answer matches a row's expected answer, by name or imported.

`make_judge(spec)` gives a `Judge` for one of the built-in names, or for
`"module:function"`, a function `(predicted: str, expected: str) -> bool` imported
at construction. Built-ins (answers and predictions have surrounding whitespace
stripped first):

- "math": math-verify equivalence (`0.5`, `1/2` and `\\frac{1}{2}` agree), as `Math-v0`.
- "exact": the two strings are equal (case and inner whitespace count).
- "contains": the expected answer occurs in the prediction (case counts).
- "regex": the expected answer is a Python regular expression the whole prediction
  matches (`re.fullmatch`); each row's pattern is compiled when the data is read.

A built-in judge never raises on any prediction. A user's function may: its
exception propagates (the rollout records it), and a result that is not a bool is
a TypeError, rather than a silent 0.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentgym.rewards.verifiable import answers_equal

BUILTIN_JUDGES: tuple[str, ...] = ("math", "exact", "contains", "regex")


def import_object(spec: str, what: str) -> Any:
    """The object `spec` ("package.module:name") names; ValueError saying why it cannot be had."""
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise ValueError(f"{what} {spec!r}; valid: 'package.module:name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{what} {spec!r}: cannot import {module_name!r} ({err})") from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"{what} {spec!r}: module {module_name!r} has no {attribute!r}") from None


def exact(predicted: str, expected: str) -> bool:
    """Whether the two are the same string, surrounding whitespace aside."""
    return predicted.strip() == expected.strip()


def contains(predicted: str, expected: str) -> bool:
    """Whether the expected answer (stripped, not empty) occurs in the prediction."""
    needle = expected.strip()
    return bool(needle) and needle in predicted


def regex(predicted: str, expected: str) -> bool:
    """Whether the stripped prediction matches the pattern `expected` as a whole."""
    return re.fullmatch(expected, predicted.strip()) is not None


def math_equal(predicted: str, expected: str) -> bool:
    """math-verify equivalence (`agentgym.rewards.verifiable.answers_equal`)."""
    return answers_equal(predicted, expected)


def regex_problem(pattern: str) -> str | None:
    """Why `pattern` is not a valid regular expression; None if it is one."""
    try:
        re.compile(pattern)
    except re.error as err:
        return f"not a valid regular expression ({err})"
    return None


@dataclass(frozen=True)
class Judge:
    """A named answer check; `check_expected` finds what is wrong with an expected answer."""

    name: str
    fn: Callable[[str, str], Any]
    check_expected: Callable[[str], str | None] | None = None

    def __call__(self, predicted: str, answers: Sequence[str]) -> bool:
        """Whether `predicted` matches any of the row's acceptable answers."""
        for expected in answers:
            verdict = self.fn(predicted, expected)
            if not isinstance(verdict, bool | np.bool_):
                raise TypeError(
                    f"judge {self.name!r} returned {verdict!r} ({type(verdict).__name__}); "
                    "valid: True or False"
                )
            if verdict:
                return True
        return False


def make_judge(spec: str) -> Judge:
    """The judge named by `spec`: a built-in name or "module:function"; ValueError otherwise."""
    builtins: dict[str, Judge] = {
        "math": Judge("math", math_equal),
        "exact": Judge("exact", exact),
        "contains": Judge("contains", contains),
        "regex": Judge("regex", regex, regex_problem),
    }
    if not isinstance(spec, str):
        raise ValueError(f"judge={spec!r}; valid: {', '.join(BUILTIN_JUDGES)} or 'module:function'")
    if spec in builtins:
        return builtins[spec]
    if ":" not in spec:
        raise ValueError(f"judge={spec!r}; valid: {', '.join(BUILTIN_JUDGES)} or 'module:function'")
    fn = import_object(spec, "judge")
    if not callable(fn):
        raise ValueError(f"judge {spec!r} is a {type(fn).__name__}; valid: a function")
    return Judge(spec, fn)
