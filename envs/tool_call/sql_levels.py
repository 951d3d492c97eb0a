"""`sql` problems above level 1: more joins, filters on several columns, grouping.

Level 1 (`tasks.py`) asks one-join counts and sums about one customer or
product. Above it, each level is a set of question kinds:

2. three-table joins filtered on several columns (customer, category, year;
   product and city);
3. grouping: GROUP BY with HAVING, COUNT(DISTINCT), the maximum of group sums;
4. revenue, quantity times unit price, over three tables and three filters;
5. groups compared with thresholds and with a subquery's average.

Answers are computed in Python from the seeded rows (`shop_facts`), never by
running the reference query; questions with an answer of 0 (or none) are left
out. A question about a customer or product is in the train split when its id
is odd; one keyed by cities, categories, years or thresholds when the sum of
their indices (the year itself) is odd: `problem.in_split`.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from agentgym.env.core import Split
from agentgym.envs.tool_call.problem import Problem, in_split, money, sql_call
from agentgym.envs.tool_call.shop_facts import categories, cities, distinct, one, tally, where
from agentgym.envs.tool_call.store import YEARS, shop_data

_JOIN_C = "JOIN customers c ON c.id = o.customer_id"
_JOIN_P = "JOIN products p ON p.id = o.product_id"
THRESHOLDS = (250, 500, 1000, 1500, 2000)  # dollars, for "spent more than"


def _year(year: int) -> str:
    return f"o.order_date LIKE '{year}-%'"


def _asked(prompt: str, answer: object, query: str) -> Problem:
    return Problem(prompt, str(answer), (sql_call(query),))


def _level2(seed: int, split: Split) -> list[Problem]:
    data, problems = shop_data(seed), []
    names = {cid: name for cid, name, _ in data.customers}
    units = tally(where(seed), lambda s: (s.customer_id, s.category, s.year), lambda s: s.quantity)
    for (cid, category, year), n in sorted(units.items()):
        if in_split(split, cid):
            name = names[cid]
            prompt = f"How many units of {category} products did customer '{name}' order in {year}?"
            query = (
                f"SELECT SUM(o.quantity) FROM orders o {_JOIN_C} {_JOIN_P} WHERE c.name = "
                f"'{name}' AND p.category = '{category}' AND {_year(year)}"
            )
            problems.append(_asked(prompt, n, query))
    products = {pid: name for pid, name, _, _ in data.products}
    for (pid, city), n in sorted(tally(where(seed), lambda s: (s.product_id, s.city), one).items()):
        if in_split(split, pid):
            product = products[pid]
            prompt = (
                f"How many orders for product '{product}' were placed by customers from {city}?"
            )
            query = (
                f"SELECT COUNT(*) FROM orders o {_JOIN_C} {_JOIN_P} "
                f"WHERE p.name = '{product}' AND c.city = '{city}'"
            )
            problems.append(_asked(prompt, n, query))
    return problems


def _level3(seed: int, split: Split) -> list[Problem]:
    problems = []
    for i, city in enumerate(cities(seed)):
        for year in YEARS:
            per_customer = tally(where(seed, city=city, year=year), lambda s: s.customer_id, one)
            for k in (2, 3):
                n = sum(1 for count in per_customer.values() if count >= k)
                if in_split(split, i, year) and n:
                    prompt = f"How many customers from {city} placed at least {k} orders in {year}?"
                    query = (
                        f"SELECT COUNT(*) FROM (SELECT o.customer_id FROM orders o {_JOIN_C} "
                        f"WHERE c.city = '{city}' AND {_year(year)} "
                        f"GROUP BY o.customer_id HAVING COUNT(*) >= {k})"
                    )
                    problems.append(_asked(prompt, n, query))
    for i, category in enumerate(categories(seed)):
        for year in YEARS:
            rows = where(seed, category=category, year=year)
            if not in_split(split, i, year) or not rows:
                continue
            n = len({s.customer_id for s in rows})
            prompt = f"How many different customers bought {category} products in {year}?"
            query = (
                f"SELECT COUNT(DISTINCT o.customer_id) FROM orders o {_JOIN_P} "
                f"WHERE p.category = '{category}' AND {_year(year)}"
            )
            problems.append(_asked(prompt, n, query))
            best = max(tally(rows, lambda s: s.product_id, lambda s: s.quantity).values())
            prompt = f"In {year}, how many units did the best-selling {category} product sell?"
            query = (
                f"SELECT MAX(units) FROM (SELECT SUM(o.quantity) AS units FROM orders o {_JOIN_P} "
                f"WHERE p.category = '{category}' AND {_year(year)} GROUP BY o.product_id)"
            )
            problems.append(_asked(prompt, best, query))
    return problems


def _level3_customers(seed: int, split: Split) -> list[Problem]:
    problems = []
    kinds = distinct(where(seed), lambda s: s.customer_id, lambda s: s.category)
    for cid, name, _ in shop_data(seed).customers:
        if in_split(split, cid) and (n := kinds.get(cid)):
            prompt = f"From how many different product categories has customer '{name}' ordered?"
            query = (
                f"SELECT COUNT(DISTINCT p.category) FROM orders o {_JOIN_C} {_JOIN_P} "
                f"WHERE c.name = '{name}'"
            )
            problems.append(_asked(prompt, n, query))
    return problems


def _level4(seed: int, split: Split) -> list[Problem]:
    problems = []
    revenue = tally(where(seed), lambda s: (s.city, s.category, s.year), lambda s: s.cents)
    for i, city in enumerate(cities(seed)):
        for j, category in enumerate(categories(seed)):
            for year in YEARS:
                if in_split(split, i, j, year) and (cents := revenue.get((city, category, year))):
                    prompt = (
                        f"How much revenue (quantity times unit price) did {category} products "
                        f"bring in from customers in {city} in {year}?"
                    )
                    query = (
                        f"SELECT SUM(o.quantity * p.price) FROM orders o {_JOIN_C} {_JOIN_P} "
                        f"WHERE p.category = '{category}' AND c.city = '{city}' AND {_year(year)}"
                    )
                    problems.append(_asked(prompt, money(cents), query))
    spent = tally(where(seed), lambda s: (s.customer_id, s.category), lambda s: s.cents)
    for cid, name, _ in shop_data(seed).customers:
        for category in categories(seed):
            if in_split(split, cid) and (cents := spent.get((cid, category))):
                prompt = (
                    f"How much has customer '{name}' spent on {category} products over all their "
                    "orders (quantity times unit price)?"
                )
                query = (
                    f"SELECT SUM(o.quantity * p.price) FROM orders o {_JOIN_C} {_JOIN_P} "
                    f"WHERE c.name = '{name}' AND p.category = '{category}'"
                )
                problems.append(_asked(prompt, money(cents), query))
    return problems


def _spend_by_customer(seed: int, **equal: object) -> dict[int, int]:
    return tally(where(seed, **equal), lambda s: s.customer_id, lambda s: s.cents)


def _level5_groups(seed: int, split: Split) -> list[Problem]:
    problems = []
    for i, city in enumerate(cities(seed)):
        for year in YEARS:
            spent = _spend_by_customer(seed, city=city, year=year)
            if in_split(split, i, year) and spent:
                prompt = (
                    f"What is the most that a single customer from {city} spent in {year} "
                    "(quantity times unit price, over all their orders that year)?"
                )
                query = (
                    "SELECT MAX(spent) FROM (SELECT SUM(o.quantity * p.price) AS spent "
                    f"FROM orders o {_JOIN_C} {_JOIN_P} WHERE c.city = '{city}' AND {_year(year)} "
                    "GROUP BY o.customer_id)"
                )
                problems.append(_asked(prompt, money(max(spent.values())), query))
    for t, dollars in enumerate(THRESHOLDS):
        for year in YEARS:
            totals = _spend_by_customer(seed, year=year).values()
            n = sum(1 for cents in totals if cents > dollars * 100)
            near = any(abs(cents - dollars * 100) <= 1 for cents in totals)  # float sums in SQL
            if in_split(split, t, year) and n and not near:
                prompt = (
                    f"How many customers spent more than ${dollars} in {year} "
                    "(quantity times unit price, over all their orders that year)?"
                )
                query = (
                    f"SELECT COUNT(*) FROM (SELECT o.customer_id FROM orders o {_JOIN_P} "
                    f"WHERE {_year(year)} GROUP BY o.customer_id "
                    f"HAVING SUM(o.quantity * p.price) > {dollars})"
                )
                problems.append(_asked(prompt, n, query))
    for j, category in enumerate(categories(seed)):
        products = distinct(
            where(seed, category=category), lambda s: s.customer_id, lambda s: s.product_id
        )
        for k in (2, 3):
            n = sum(1 for count in products.values() if count >= k)
            if in_split(split, j, k) and n:
                prompt = (
                    f"How many customers have ordered at least {k} different {category} products?"
                )
                query = (
                    f"SELECT COUNT(*) FROM (SELECT o.customer_id FROM orders o {_JOIN_P} "
                    f"WHERE p.category = '{category}' GROUP BY o.customer_id "
                    f"HAVING COUNT(DISTINCT o.product_id) >= {k})"
                )
                problems.append(_asked(prompt, n, query))
    return problems


def _level5_above_average(seed: int, split: Split) -> list[Problem]:
    problems = []
    for year in YEARS:
        lines = where(seed, year=year)
        average = Fraction(sum(s.cents for s in lines), len(lines))
        for cid, name, _ in shop_data(seed).customers:
            mine = [s.cents for s in lines if s.customer_id == cid]
            n = sum(1 for cents in mine if cents > average)
            near = any(abs(cents - average) < 1 for cents in mine)  # SQL compares floats
            if not in_split(split, cid) or not n or near:
                continue
            prompt = (
                f"How many of the orders customer '{name}' placed in {year} cost more (quantity "
                f"times unit price) than the average order placed in {year} by any customer?"
            )
            query = (
                f"SELECT COUNT(*) FROM orders o {_JOIN_C} {_JOIN_P} WHERE c.name = '{name}' "
                f"AND {_year(year)} AND o.quantity * p.price > (SELECT AVG(o2.quantity * p2.price) "
                "FROM orders o2 JOIN products p2 ON p2.id = o2.product_id "
                f"WHERE o2.order_date LIKE '{year}-%')"
            )
            problems.append(_asked(prompt, n, query))
    return problems


SQL_LEVELS: dict[int, tuple[Callable[[int, Split], list[Problem]], ...]] = {
    2: (_level2,),
    3: (_level3, _level3_customers),
    4: (_level4,),
    5: (_level5_groups, _level5_above_average),
}
"""The problem builders of each level above 1."""


def harder_sql_problems(seed: int, split: Split, difficulty: int) -> list[Problem]:
    """Every sql problem of `split` at `difficulty` (2 or more), in a fixed order."""
    return [p for build in SQL_LEVELS[difficulty] for p in build(seed, split)]
