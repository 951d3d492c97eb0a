"""The shop's orders joined with their customers and products, in Python.

The harder levels' answers are computed here from `shop_data`, not by running
their reference queries, so a test can hold each query to the answer.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from agentgym.envs.tool_call.store import shop_data

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Sale:
    """One order line with everything the questions filter or group on."""

    customer_id: int
    customer: str
    city: str
    product_id: int
    product: str
    category: str
    price_cents: int
    quantity: int
    year: int

    @property
    def cents(self) -> int:
        """What the line cost: quantity times unit price, in cents."""
        return self.quantity * self.price_cents


@functools.lru_cache(maxsize=16)
def sales(seed: int) -> tuple[Sale, ...]:
    """Every order of the seeded shop, joined."""
    data = shop_data(seed)
    customers = {c[0]: c for c in data.customers}
    products = {p[0]: p for p in data.products}
    rows = []
    for _, cid, pid, quantity, day in data.orders:
        _, customer, city = customers[cid]
        _, product, category, price = products[pid]
        rows.append(
            Sale(cid, customer, city, pid, product, category, price, quantity, int(day[:4]))
        )
    return tuple(rows)


@functools.lru_cache(maxsize=16)
def cities(seed: int) -> tuple[str, ...]:
    """The cities customers live in, sorted; a city's index keys its split."""
    return tuple(sorted({c[2] for c in shop_data(seed).customers}))


@functools.lru_cache(maxsize=16)
def categories(seed: int) -> tuple[str, ...]:
    """The product categories, sorted; a category's index keys its split."""
    return tuple(sorted({p[2] for p in shop_data(seed).products}))


def tally(
    rows: Iterable[Sale], key: Callable[[Sale], K], value: Callable[[Sale], int]
) -> dict[K, int]:
    """The sum of `value` over `rows`, per `key`."""
    totals: Counter[K] = Counter()
    for row in rows:
        totals[key(row)] += value(row)
    return dict(totals)


def distinct(
    rows: Iterable[Sale], key: Callable[[Sale], K], value: Callable[[Sale], Hashable]
) -> dict[K, int]:
    """How many different `value`s each `key` has among `rows`."""
    seen: defaultdict[K, set[Hashable]] = defaultdict(set)
    for row in rows:
        seen[key(row)].add(value(row))
    return {k: len(v) for k, v in seen.items()}


def where(seed: int, **equal: object) -> list[Sale]:
    """The sales whose fields equal the given values, e.g. `where(0, city="Lyon", year=2023)`."""
    return [s for s in sales(seed) if all(getattr(s, f) == v for f, v in equal.items())]


def one(_: Sale) -> int:
    """Counts rows, for `tally`."""
    return 1
