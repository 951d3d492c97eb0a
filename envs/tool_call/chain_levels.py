"""`chain` problems above level 1: more steps, each needing the one before it.

Level 1 (`tasks.py`): a customer's spend in a year (sql), plus tax (calculator).
Above it, the question names a customer, or a city, only by a description that
a query must resolve first:

2. the customer from a city with the most orders in a year (sql), their spend
   that year (sql), plus tax (calculator): 3 calls;
3. as 2, with a discount taken off before the tax (calculator, calculator):
   4 calls;
4. the city that bought the most units of a category in a year (sql), its
   customer who spent the most that year (sql), their spend (sql), then
   discount and tax in one calculation: 4 calls, three of them lookups that
   each need the one before;
5. as 4, the city ranked by its spend on the category and the customer by
   theirs: each lookup a grouped three-table query.

Four calls is the most: with one call a turn and the answer in the fifth, the
reference solution ends before `agentgym/ToolCall-v0`'s six-step limit, which
would mark the episode truncated as well as terminated. Descriptions whose
answer is a tie are left out, as are amounts whose rounding is a tie. A
question keyed by a city (or category) index and a year is a train question
when their sum is odd (`problem.in_split`).
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction

from agentgym.env.core import Split
from agentgym.envs.tool_call.calculator import format_number
from agentgym.envs.tool_call.problem import (
    DISCOUNTS,
    TAX_RATES,
    Problem,
    calculator_call,
    in_split,
    money,
    rounded_cents,
    sql_call,
    unique_top,
)
from agentgym.envs.tool_call.shop_facts import categories, cities, one, tally, where
from agentgym.envs.tool_call.store import YEARS
from agentgym.types import ToolCall

_JOINS = (
    "FROM orders o JOIN customers c ON c.id = o.customer_id JOIN products p ON p.id = o.product_id"
)
_ROUNDING = "Give the amount rounded to 2 decimal places."


def _year(year: int) -> str:
    return f"o.order_date LIKE '{year}-%'"


def _priced(
    cents: int, rate: str, discount: str | None, *, one_call: bool = False
) -> tuple[str, tuple[ToolCall, ...], str] | None:
    """(how the price is put, the calculator calls, the rounded answer); None on a rounding tie.

    The discount is its own call, on the amount, unless `one_call` folds it into the tax's.
    """
    amount, calls, discounted = Fraction(cents, 100), [], ""
    if discount is not None:
        factor = 1 - Fraction(discount) / 100
        discounted = f" * {format_number(factor)}"
        if not one_call:
            calls.append(calculator_call(f"{money(cents)}{discounted}"))
        amount *= factor
    multiplier = 1 + Decimal(rate) / 100
    if one_call:
        calls.append(calculator_call(f"{money(cents)}{discounted} * {multiplier}"))
    else:
        calls.append(calculator_call(f"{format_number(amount)} * {multiplier}"))
    answer = rounded_cents(Decimal(format_number(amount)) * multiplier)
    if answer is None:
        return None
    words = f"with {rate}% sales tax added on top"
    if discount is not None:
        words = (
            f"with a {discount}% discount taken off first and then {rate}% sales tax added "
            "to the discounted amount"
        )
    return words, tuple(calls), answer


def _spend_query(name: str, year: int) -> str:
    return f"SELECT SUM(o.quantity * p.price) {_JOINS} WHERE c.name = '{name}' AND {_year(year)}"


def _top_customer(
    seed: int, city: str, year: int, by_revenue: bool, category: str | None = None
) -> tuple[str, str] | None:
    """(name, query) of the customer from `city` with the most orders (or spend) in `year`,
    counting only `category`'s products when one is given."""
    rows = [s for s in where(seed, city=city, year=year) if category in (None, s.category)]
    score = (lambda s: s.cents) if by_revenue else one
    top = unique_top(tally(rows, lambda s: s.customer, score))
    only = f" AND p.category = '{category}'" if category else ""
    order = "SUM(o.quantity * p.price)" if by_revenue else "COUNT(*)"
    query = (
        f"SELECT c.name {_JOINS} WHERE c.city = '{city}'{only} AND {_year(year)} "
        f"GROUP BY c.id ORDER BY {order} DESC LIMIT 1"
    )
    return None if top is None else (top, query)


def _top_city(seed: int, category: str, year: int, by_revenue: bool) -> tuple[str, str] | None:
    """(city, query) of the city whose customers bought the most of `category` in `year`."""
    rows = where(seed, category=category, year=year)
    score = (lambda s: s.cents) if by_revenue else (lambda s: s.quantity)
    top = unique_top(tally(rows, lambda s: s.city, score))
    order = "SUM(o.quantity * p.price)" if by_revenue else "SUM(o.quantity)"
    query = (
        f"SELECT c.city {_JOINS} WHERE p.category = '{category}' AND {_year(year)} "
        f"GROUP BY c.city ORDER BY {order} DESC LIMIT 1"
    )
    return None if top is None else (top, query)


def _spend(seed: int, name: str, year: int) -> int:
    return sum(s.cents for s in where(seed, customer=name, year=year))


def _by_city(seed: int, split: Split, discounts: tuple[str | None, ...]) -> list[Problem]:
    """Levels 2 and 3: the top customer of a city and year, then their spend."""
    problems = []
    for i, city in enumerate(cities(seed)):
        for year in YEARS:
            found = _top_customer(seed, city, year, by_revenue=False)
            if found is None or not in_split(split, i, year):
                continue
            name, find = found
            lookups = (sql_call(find), sql_call(_spend_query(name, year)))
            for discount in discounts:
                for rate in TAX_RATES:
                    if (priced := _priced(_spend(seed, name, year), rate, discount)) is None:
                        continue
                    words, calcs, answer = priced
                    prompt = (
                        f"Find the customer from {city} who placed the most orders in {year}. "
                        f"What did that customer pay for all their orders placed in {year} "
                        f"(quantity times unit price), {words}? {_ROUNDING}"
                    )
                    problems.append(Problem(prompt, answer, lookups + calcs))
    return problems


def _describe(category: str, year: int, by_revenue: bool) -> str:
    if by_revenue:
        found = (
            f"Find the city whose customers spent the most on {category} products in {year} "
            f"(quantity times unit price), then the customer from that city who spent the most "
            f"on {category} products in {year}."
        )
    else:
        found = (
            f"Find the city whose customers bought the most units of {category} products in "
            f"{year}, then the customer from that city who spent the most in {year} (quantity "
            "times unit price)."
        )
    return f"{found} What did that customer pay for all their orders placed in {year}"


def _by_category(seed: int, split: Split, by_revenue: bool) -> list[Problem]:
    """Levels 4 and 5: the top city of a category and year, its top customer, their spend."""
    problems = []
    for j, category in enumerate(categories(seed)):
        for year in YEARS:
            city = _top_city(seed, category, year, by_revenue)
            only = category if by_revenue else None
            customer = city and _top_customer(seed, city[0], year, by_revenue=True, category=only)
            if not city or not customer or not in_split(split, j, year):
                continue
            cents = _spend(seed, customer[0], year)
            spend = _spend_query(customer[0], year)
            lookups = (sql_call(city[1]), sql_call(customer[1]), sql_call(spend))
            for discount in DISCOUNTS:
                for rate in TAX_RATES:
                    if (priced := _priced(cents, rate, discount, one_call=True)) is not None:
                        words, calcs, answer = priced
                        prompt = f"{_describe(category, year, by_revenue)}, {words}? {_ROUNDING}"
                        problems.append(Problem(prompt, answer, lookups + calcs))
    return problems


CHAIN_LEVELS: dict[int, Callable[[int, Split], list[Problem]]] = {
    2: lambda seed, split: _by_city(seed, split, (None,)),
    3: lambda seed, split: _by_city(seed, split, DISCOUNTS),
    4: lambda seed, split: _by_category(seed, split, by_revenue=False),
    5: lambda seed, split: _by_category(seed, split, by_revenue=True),
}
"""The problem builder of each level above 1."""


def harder_chain_problems(seed: int, split: Split, difficulty: int) -> list[Problem]:
    """Every chain problem of `split` at `difficulty` (2 or more), in a fixed order."""
    return CHAIN_LEVELS[difficulty](seed, split)
