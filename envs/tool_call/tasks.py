"""The task families of `ToolCallEnv`: seeded problems, each with a reference solution.

A family maps (seed, split, index) to a `Problem`: the prompt, the one correct
answer, and the tool calls of a reference solution. Every problem needs a
tool: the arithmetic is too long to do reliably in one's head, and the data
lives only in the shop database (or, for `purchase`, behind its lookup tools).

Each family has `LEVELS` difficulty levels. Level 1 is the tasks below, the
same for the same ids at every release; the harder levels are built in
`calculator_levels.py`, `sql_levels.py` and `chain_levels.py`:

- `calculator`: 1: six templates of 3-4 operands with 3-6 digits; 2: 5
  operands of 3-5 digits; 3: 6 of 3-6 digits, with a `//`; 4: 7-8 of 4-7
  digits, with up to two `//` or `%`; 5: 9-10 of 5-9 digits, and small powers.
- `sql`: 1: one-join counts and sums about one customer or product; 2: three
  tables, filters on several columns; 3: GROUP BY, HAVING, COUNT(DISTINCT);
  4: revenue over three tables and three filters; 5: groups against
  thresholds and a subquery's average.
- `chain`: 1: sql then calculator (2 calls); 2: find a customer, then 1 (3);
  3: 2 with a discount (4); 4: find a city, then 3 (5); 5: 4 ranked by revenue.
- `purchase` (`purchase.py`, not a default family): lookups in a seeded
  purchasing world, then the calculator: 1: price (2 calls); 2: the supplier's
  discount (3); 3: 2 with the price looked up (4); 4: the tax of the
  supplier's city (4); 5: 4 for two items, with the tax of the second item's
  supplier's city (4).

The splits are disjoint by construction, not by luck:

- `calculator`: the operands of a train problem sum to an even number, those of
  a test problem to an odd one (a draw with the wrong parity is redrawn), so no
  expression is in both splits.
- `sql` and `chain`: questions about customers and products with odd ids are
  train questions, even ids test ones; above level 1, questions keyed by
  cities, categories, years or thresholds go by the parity of the sum of their
  indices (`problem.in_split`).
- `purchase`: items at even positions of the world's item list are train
  items, odd ones test items, and a task names only items of its split.
"""

from __future__ import annotations

import functools
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

from agentgym.env.core import Split
from agentgym.envs.tool_call.calculator import evaluate, format_number
from agentgym.envs.tool_call.calculator_levels import harder_calculator_problem
from agentgym.envs.tool_call.chain_levels import harder_chain_problems
from agentgym.envs.tool_call.problem import TAX_RATES, Problem, split_parity
from agentgym.envs.tool_call.purchase import purchase_problems
from agentgym.envs.tool_call.sql_levels import harder_sql_problems
from agentgym.envs.tool_call.store import YEARS, shop_data
from agentgym.types import ToolCall

CALCULATOR_SIZES = {"train": 100_000, "test": 500}


# -- calculator -----------------------------------------------------------------


def _calc_templates(rng: random.Random) -> tuple[str, list[int]]:
    """One expression and its operands."""
    r = rng.randint
    kind = rng.randrange(6)
    if kind == 0:
        ops = [r(10_000, 99_999), r(1000, 9999), r(1000, 9999)]
        return "{} * {} - {}".format(*ops), ops
    if kind == 1:
        ops = [r(1000, 99_999), r(1000, 99_999), r(100, 9999)]
        return "({} + {}) * {}".format(*ops), ops
    if kind == 2:
        ops = [r(100, 9999), r(100, 9999), r(100, 9999), r(100, 9999)]
        return "{} * {} + {} * {}".format(*ops), ops
    if kind == 3:  # exact division: the divisor divides the multiplier
        a, b, d = r(10_000, 99_999), r(100, 9999), r(3, 97)
        ops = [a, b, d * r(11, 99), d]
        return "({} - {}) * {} / {}".format(*ops), ops
    if kind == 4:
        ops = [r(101, 999), r(100, 999), r(100, 999)]
        return "{} ** 3 - {} * {}".format(*ops), ops
    ops = [r(100_000, 999_999), r(101, 9999), r(10, 999), r(100, 999)]
    return "{} % {} + {} * {}".format(*ops), ops


def calculator_problem(seed: int, split: Split, index: int) -> Problem:
    rng = random.Random(f"agentgym/tool_call/calculator/{seed}/{split}/{index}")
    while True:
        expression, operands = _calc_templates(rng)
        if sum(operands) % 2 == split_parity(split):
            break
    answer = format_number(evaluate(expression))
    call = ToolCall("calculator", {"expression": expression})
    return Problem(f"What is {expression}?", answer, (call,))


# -- sql ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Facts:
    """What the questions ask about, computed from the seeded rows in Python."""

    orders_in_year: dict[tuple[int, int], int]  # (customer, year) -> orders
    cents_in_year: dict[tuple[int, int], int]  # (customer, year) -> spent, in cents
    quantity: dict[int, int]  # product -> units sold
    distinct_products: dict[int, int]  # customer -> different products ordered


@functools.lru_cache(maxsize=16)
def _facts(seed: int) -> _Facts:
    data = shop_data(seed)
    price = {p[0]: p[3] for p in data.products}
    orders: Counter[tuple[int, int]] = Counter()
    cents: Counter[tuple[int, int]] = Counter()
    quantity: Counter[int] = Counter()
    bought = defaultdict(set)
    for _, customer, product, qty, day in data.orders:
        key = (customer, int(day[:4]))
        orders[key] += 1
        cents[key] += qty * price[product]
        quantity[product] += qty
        bought[customer].add(product)
    return _Facts(dict(orders), dict(cents), dict(quantity), {c: len(p) for c, p in bought.items()})


def _sql(query: str) -> ToolCall:
    return ToolCall("sql", {"query": query})


_BY_CUSTOMER = "FROM orders o JOIN customers c ON c.id = o.customer_id WHERE c.name = '{}'"


def _sql_problems(seed: int, split: Split) -> list[Problem]:
    data, facts = shop_data(seed), _facts(seed)
    parity = 1 - split_parity(split)  # odd ids train, even ids test
    problems = []
    for cid, name, _ in data.customers:
        if cid % 2 != parity:
            continue
        for year in YEARS:
            if n := facts.orders_in_year.get((cid, year)):
                query = (
                    f"SELECT COUNT(*) {_BY_CUSTOMER.format(name)} AND o.order_date LIKE '{year}-%'"
                )
                prompt = f"How many orders did customer '{name}' place in {year}?"
                problems.append(Problem(prompt, str(n), (_sql(query),)))
        if n := facts.distinct_products.get(cid):
            query = f"SELECT COUNT(DISTINCT o.product_id) {_BY_CUSTOMER.format(name)}"
            prompt = f"How many different products has customer '{name}' ordered?"
            problems.append(Problem(prompt, str(n), (_sql(query),)))
    for pid, name, _, _ in data.products:
        if pid % 2 == parity and (n := facts.quantity.get(pid)):
            query = (
                "SELECT SUM(o.quantity) FROM orders o JOIN products p ON p.id = o.product_id "
                f"WHERE p.name = '{name}'"
            )
            prompt = f"What is the total quantity of product '{name}' sold, over all orders?"
            problems.append(Problem(prompt, str(n), (_sql(query),)))
    return problems


# -- chain: sql, then calculator ------------------------------------------------


def _chain_problems(seed: int, split: Split) -> list[Problem]:
    data, facts = shop_data(seed), _facts(seed)
    parity = 1 - split_parity(split)
    problems = []
    for cid, name, _ in data.customers:
        for year in YEARS:
            cents = facts.cents_in_year.get((cid, year))
            if cid % 2 != parity or not cents:
                continue
            total = Decimal(cents) / 100
            for rate in TAX_RATES:
                multiplier = 1 + Decimal(rate) / 100
                exact = total * multiplier
                if (exact * 100) % 1 == Decimal("0.5"):
                    continue  # a tie: rounding half up or half even would disagree
                answer = exact.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
                query = (
                    "SELECT SUM(o.quantity * p.price) FROM orders o "
                    "JOIN customers c ON c.id = o.customer_id "
                    "JOIN products p ON p.id = o.product_id "
                    f"WHERE c.name = '{name}' AND o.order_date LIKE '{year}-%'"
                )
                expression = f"{format_number(Fraction(total))} * {multiplier}"
                prompt = (
                    f"What did customer '{name}' pay for all their orders placed in {year} "
                    f"(quantity times unit price), with {rate}% sales tax added on top? "
                    "Give the amount rounded to 2 decimal places."
                )
                calls = (_sql(query), ToolCall("calculator", {"expression": expression}))
                problems.append(Problem(prompt, str(answer), calls))
    return problems


@functools.lru_cache(maxsize=64)
def _listed(family: str, seed: int, split: Split, difficulty: int) -> tuple[Problem, ...]:
    """A listed family's problems in a seeded order (the shop's size bounds their number)."""
    if difficulty == 1:
        problems = _LISTED[family](seed, split)
        order = f"agentgym/tool_call/{family}/order/{seed}/{split}"
    else:
        problems = _HARDER[family](seed, split, difficulty)
        order = f"agentgym/tool_call/{family}/order/level{difficulty}/{seed}/{split}"
    random.Random(order).shuffle(problems)
    return tuple(problems)


_LISTED: dict[str, Callable[[int, Split], list[Problem]]] = {
    "sql": _sql_problems,
    "chain": _chain_problems,
    "purchase": lambda seed, split: purchase_problems(seed, split, 1),
}
_HARDER: dict[str, Callable[[int, Split, int], list[Problem]]] = {
    "sql": harder_sql_problems,
    "chain": harder_chain_problems,
    "purchase": purchase_problems,
}

FAMILIES: tuple[str, ...] = ("calculator", "sql", "chain")
"""The default families; every run and test that names none uses these."""
ALL_FAMILIES: tuple[str, ...] = (*FAMILIES, "purchase")
"""Every valid family; `purchase` is used only where named."""


def family_size(family: str, seed: int, split: Split, difficulty: int = 1) -> int:
    """How many problems `family` holds in `split` at `difficulty`."""
    if family == "calculator":
        return CALCULATOR_SIZES[split]
    return len(_listed(family, seed, split, difficulty))


def problem(family: str, seed: int, split: Split, index: int, difficulty: int = 1) -> Problem:
    """The `index`-th problem of `family` in `split` at `difficulty` (0 <= index < family_size)."""
    if family == "calculator" and difficulty == 1:
        return calculator_problem(seed, split, index)
    if family == "calculator":
        return harder_calculator_problem(seed, split, index, difficulty)
    return _listed(family, seed, split, difficulty)[index]
