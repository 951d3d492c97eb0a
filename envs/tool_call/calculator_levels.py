"""`calculator` problems above level 1: longer expressions of more and larger operands.

An expression is a random binary tree whose every compound operand is
parenthesised, so its value never depends on operator precedence. `//` and
`%` (at most one or two of them) divide a compound operand by a literal from 7
to 997, and `**` raises a literal of two or
three digits to the power 2 or 3, so every value is an integer and stays far
inside the calculator's bounds (at most about 100 digits, 200 characters).

Values under 100 in size are redrawn, as a division can collapse a whole
expression to 0. As at level 1, a train expression's operands sum to an even number and a test
expression's to an odd one, so no expression is in both splits.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from agentgym.env.core import Split
from agentgym.envs.tool_call.calculator import evaluate, format_number
from agentgym.envs.tool_call.problem import Problem, calculator_call, split_parity


@dataclass(frozen=True)
class CalculatorLevel:
    """How a level's expressions are drawn."""

    operands: tuple[int, int]  # how many numbers, inclusive range
    digits: tuple[int, int]  # digits of each number, inclusive range
    divisions: tuple[str, ...] = ()  # "//" and/or "%", by a literal
    max_divisions: int = 0  # how many of them one expression may have
    power_chance: float = 0.0  # chance that a number is a small power instead


CALCULATOR_LEVELS = {
    2: CalculatorLevel((5, 5), (3, 5)),
    3: CalculatorLevel((6, 6), (3, 6), ("//",), max_divisions=1),
    4: CalculatorLevel((7, 8), (4, 7), ("//", "%"), max_divisions=2),
    5: CalculatorLevel((9, 10), (5, 9), ("//", "%"), max_divisions=2, power_chance=0.15),
}
"""Level 1 is `tasks.calculator_problem`'s six templates: 3-4 operands of 3-6 digits."""


class _Drawer:
    """Draws one expression; collects its operands (every literal) as it goes."""

    def __init__(self, rng: random.Random, level: CalculatorLevel):
        self.rng, self.level = rng, level
        self.operands: list[int] = []
        self.divisions_left = level.max_divisions

    def literal(self, low: int, high: int) -> str:
        value = self.rng.randint(low, high)
        self.operands.append(value)
        return str(value)

    def leaf(self) -> str:
        if self.rng.random() < self.level.power_chance:
            base = self.literal(11, 999)
            return f"({base} ** {self.literal(2, 3)})"
        digits = self.rng.randint(*self.level.digits)
        return self.literal(10 ** (digits - 1), 10**digits - 1)

    def node(self, n: int) -> str:
        """An expression of `n` operands (a power counts as one)."""
        if n == 1:
            return self.leaf()
        if self.divisions_left and n > 2 and self.rng.random() < 0.4:
            self.divisions_left -= 1
            op = self.rng.choice(self.level.divisions)
            return f"{self.operand(n - 1)} {op} {self.literal(7, 997)}"
        k = self.rng.randint(1, n - 1)
        op = self.rng.choice(("+", "-", "*"))
        return f"{self.operand(k)} {op} {self.operand(n - k)}"

    def operand(self, n: int) -> str:
        """`node(n)`, in parentheses when it is compound."""
        return self.node(n) if n == 1 else f"({self.node(n)})"


def harder_calculator_problem(seed: int, split: Split, index: int, difficulty: int) -> Problem:
    """The `index`-th calculator problem of `split` at `difficulty` (2 or more)."""
    level = CALCULATOR_LEVELS[difficulty]
    rng = random.Random(f"agentgym/tool_call/calculator/level{difficulty}/{seed}/{split}/{index}")
    while True:
        drawer = _Drawer(rng, level)
        expression = drawer.node(rng.randint(*level.operands))
        if sum(drawer.operands) % 2 != split_parity(split):
            continue
        value = evaluate(expression)
        if abs(value) >= 100:  # a division can collapse everything to 0: too easy to guess
            break
    answer = format_number(value)
    return Problem(f"What is {expression}?", answer, (calculator_call(expression),))
