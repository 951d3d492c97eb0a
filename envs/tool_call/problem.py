"""What every `ToolCallEnv` task family shares: the `Problem` record, levels, splits, money."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from typing import Any, TypeVar

from agentgym.env.core import Split
from agentgym.env.core import check_difficulty as check_level
from agentgym.envs.tool_call.calculator import format_number
from agentgym.types import ToolCall

LEVELS = 5
"""Difficulty levels run from 1 (the original tasks) to `LEVELS`."""

TAX_RATES = ("5", "6.5", "7", "7.25", "8", "8.5", "9.5", "12")
DISCOUNTS = ("5", "10", "15", "20")

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Problem:
    """One task: its prompt, its answer, and the calls of a reference solution."""

    prompt: str
    answer: str
    calls: tuple[ToolCall, ...]


def check_difficulty(difficulty: Any) -> int:
    """`difficulty` if it is a level (1 to `LEVELS`); ValueError naming the range otherwise."""
    return check_level(difficulty, LEVELS)


def split_parity(split: Split) -> int:
    """0 for train, 1 for test: the parity a split's problems are built to have."""
    return 0 if split == "train" else 1


def in_split(split: Split, *parts: int) -> bool:
    """Whether a question keyed by these integers (ids, indices, years) is in `split`.

    Odd sums are train questions, even ones test questions, as odd and even
    customer ids are at level 1; the parts are all in the prompt, so no prompt
    is in both splits.
    """
    return sum(parts) % 2 != split_parity(split)


def sql_call(query: str) -> ToolCall:
    return ToolCall("sql", {"query": query})


def calculator_call(expression: str) -> ToolCall:
    return ToolCall("calculator", {"expression": expression})


def money(cents: int) -> str:
    """An amount in cents as the sql tool shows dollars: "495.32", "495.3", "495"."""
    return format_number(Fraction(cents, 100))


def unique_top(scores: Mapping[K, int | Fraction]) -> K | None:
    """The key with the strictly highest score; None when there is none or a tie."""
    if not scores:
        return None
    ranked = sorted(scores.items(), key=lambda kv: kv[1], reverse=True)
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return None
    return ranked[0][0]


def rounded_cents(exact: Decimal) -> str | None:
    """`exact` rounded half up to cents; None on a tie, where half up and half even disagree."""
    if (exact * 100) % 1 == Decimal("0.5"):
        return None
    return str(exact.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))
