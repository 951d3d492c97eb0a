"""The `purchase` family: a small seeded purchasing world behind narrow lookup tools.

The world of a seed (`purchase_world`) has `ITEMS` items (plain nouns, each with
a unit price, a supplier and a weight), `SUPPLIERS` suppliers (each with a
discount from `DISCOUNTS` and a city) and `CITIES` cities (each with its own
tax rate from `TAX_RATES`, and the weather). The agent reaches it only through
one-argument lookups: `price(item)`, `supplier(item)`, `discount(supplier)`,
`city(supplier)`, `tax(city)`, and two distractors that no task needs,
`weight(item)` and `weather(city)`. Names match case-insensitively, around
whitespace; an unknown name is a tool error that shows what a valid one looks
like. Prompts are one or two short sentences, as a CPU policy needs.

Levels (each `->` a call that takes the one before's result):

1. "What do 7 lamps cost?": price(lamp), calculator: 2 calls;
2. the price given, less the supplier's discount: supplier(lamp) -> discount,
   calculator: 3 calls;
3. as 2, the price looked up too: supplier(lamp) -> discount, price(lamp),
   calculator: 4 calls;
4. the price given, plus the sales tax of the supplier's city: supplier(lamp)
   -> city -> tax, calculator: 4 calls;
5. two items, both prices given, plus the tax of the city of the *second*
   item's supplier on the whole order: supplier(kettle) -> city -> tax,
   calculator: 4 calls. It asks all of level 4 and more: the chain is as long,
   the agent must pick the right item's supplier (the two items' cities differ,
   so the other's tax gives a wrong answer), and the calculation has two terms.
   A second chain (price, or the other supplier's discount) would take a fifth
   call, and four is the most that ends within `agentgym/ToolCall-v0`'s
   six-step limit with one call a turn (see `chain_levels.py`).

Amounts are rounded half up to cents. Unit prices have an odd number of cents
that is no multiple of 5, so an exact amount ends in half a cent for at most one
quantity of an item at levels 2 to 4 (10 with a 5% or 15% discount or 5% tax, 5
with 10%); such ties are left out. Quantities run from 2 to 12.

Splits: items at even positions of the world's (seeded) item list are train
items, those at odd positions test items, and a task names only items of its
split, so no prompt is in both. Each supplier has two items in each split.
A split holds 176 tasks at level 1, at least 160 at levels 2 to 4 (at most one
tie per item) and 208 at level 5 (one per ordered pair of its items whose
suppliers are in different cities).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol, TypeVar

from agentgym.env.core import Split
from agentgym.envs.tool_call.problem import (
    DISCOUNTS,
    TAX_RATES,
    Problem,
    calculator_call,
    money,
    rounded_cents,
    split_parity,
)
from agentgym.tools import Tool, tool
from agentgym.types import ToolCall

ITEMS, SUPPLIERS, CITIES = 32, 8, 6
QUANTITIES = range(2, 13)

_NOUN_WORDS = """
    lamp desk chair kettle mug plate towel pillow blanket candle clock mirror vase basket
    bucket broom ladder hammer drill shovel rake helmet jacket glove boot sock hat umbrella
    backpack wallet notebook pencil marker stapler printer monitor keyboard speaker toaster
    blender teapot spoon bowl bottle jar rug curtain cushion
"""
NOUNS = tuple(_NOUN_WORDS.split())
"""Item names: nouns whose plural adds an "s"."""
_SUPPLIER_WORDS = (
    "Brindle Caxton Dorvel Elmridge Farrow Greyholt Hanlow Ivesby Jarrold Kestrel Lomax Marlow"
)
SUPPLIER_NAMES = tuple(_SUPPLIER_WORDS.split())
CITY_NAMES = ("Oslo", "Lima", "Perth", "Quito", "Dakar", "Hanoi", "Turin", "Leeds", "Bergen")
WEATHER = ("sunny, 24 C", "cloudy, 15 C", "rain, 11 C", "snow, -3 C", "windy, 9 C", "fog, 7 C")

LOOKUPS: Mapping[str, str] = {
    "price": "item",
    "supplier": "item",
    "weight": "item",
    "discount": "supplier",
    "city": "supplier",
    "tax": "city",
    "weather": "city",
}
"""Each lookup tool and the kind of name it takes (also its argument's name)."""
DISTRACTORS = frozenset({"weight", "weather"})
"""Lookups offered to the agent that no task needs."""


@dataclass(frozen=True)
class Item:
    name: str
    cents: int
    supplier: str
    weight_kg: str


@dataclass(frozen=True)
class Supplier:
    name: str
    discount: str
    city: str


@dataclass(frozen=True)
class City:
    name: str
    tax: str
    weather: str


class _Named(Protocol):
    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=_Named)
_PLURAL = {"item": "items", "supplier": "suppliers", "city": "cities"}


def normalised(name: str) -> str:
    """How lookups compare names: case-insensitively, surrounding whitespace ignored."""
    return name.strip().lower()


def _find(table: Mapping[str, N], kind: str, name: str) -> N:
    """The entry called `name`; ValueError saying what a `kind`'s name looks like otherwise."""
    key = normalised(name)
    if key in table:
        return table[key]
    close = difflib.get_close_matches(key[:40], list(table), n=1)
    example = table[close[0] if close else next(iter(table))].name
    raise ValueError(f"no {kind} {name!r}; {_PLURAL[kind]} look like {example!r}")


@dataclass(frozen=True)
class World:
    """One seed's items, suppliers and cities, each keyed by its normalised name."""

    items: Mapping[str, Item]  # in the world's order, which decides the splits
    suppliers: Mapping[str, Supplier]
    cities: Mapping[str, City]

    def find_item(self, name: str) -> Item:
        return _find(self.items, "item", name)

    def find_supplier(self, name: str) -> Supplier:
        return _find(self.suppliers, "supplier", name)

    def find_city(self, name: str) -> City:
        return _find(self.cities, "city", name)

    def supplier_of(self, item: str) -> Supplier:
        return self.find_supplier(self.find_item(item).supplier)

    def split_items(self, split: Split) -> list[Item]:
        """The items a `split`'s tasks may name: every other one of the world's list."""
        return [it for i, it in enumerate(self.items.values()) if i % 2 == split_parity(split)]

    # The lookup tools: their names, arguments and docstrings are the tools' schemas.

    def price(self, item: str) -> str:
        """An item's unit price in dollars."""
        return money(self.find_item(item).cents)

    def supplier(self, item: str) -> str:
        """The supplier of an item."""
        return self.find_item(item).supplier

    def weight(self, item: str) -> str:
        """An item's weight in kg."""
        return self.find_item(item).weight_kg

    def discount(self, supplier: str) -> str:
        """A supplier's discount in percent."""
        return self.find_supplier(supplier).discount

    def city(self, supplier: str) -> str:
        """The city a supplier is in."""
        return self.find_supplier(supplier).city

    def tax(self, city: str) -> str:
        """A city's sales tax rate in percent."""
        return self.find_city(city).tax

    def weather(self, city: str) -> str:
        """Today's weather in a city."""
        return self.find_city(city).weather

    def lookups(self) -> dict[str, Callable[..., str]]:
        """Each lookup tool's body, by the tool's name."""
        return {
            "price": self.price,
            "supplier": self.supplier,
            "weight": self.weight,
            "discount": self.discount,
            "city": self.city,
            "tax": self.tax,
            "weather": self.weather,
        }


def _cents(rng: random.Random) -> int:
    """A unit price from $1.50 to $99.99 with cents prime to 10 (see the module on ties)."""
    while True:
        cents = rng.randint(150, 9999)
        if cents % 2 and cents % 5:
            return cents


@functools.lru_cache(maxsize=16)
def purchase_world(seed: int) -> World:
    """The world of `seed`: the same for the same seed, built once."""
    rng = random.Random(f"agentgym/tool_call/purchase/world/{seed}")
    cities = [
        City(name, tax, rng.choice(WEATHER))
        for name, tax in zip(
            rng.sample(CITY_NAMES, CITIES), rng.sample(TAX_RATES, CITIES), strict=True
        )
    ]
    homes = [c.name for c in cities]
    homes += rng.sample(homes, SUPPLIERS - CITIES)  # every city has a supplier
    discounts = rng.sample(DISCOUNTS * 2, SUPPLIERS)  # every discount twice
    names = rng.sample(SUPPLIER_NAMES, SUPPLIERS)
    suppliers = [Supplier(*row) for row in zip(names, discounts, homes, strict=True)]
    items = [
        # neighbours share a supplier, so that each supplier has items in both splits
        Item(noun, _cents(rng), names[i // 2 % SUPPLIERS], f"{rng.randint(1, 250) / 10:.1f}")
        for i, noun in enumerate(rng.sample(NOUNS, ITEMS))
    ]
    return World(
        {it.name: it for it in items},
        {normalised(s.name): s for s in suppliers},
        {normalised(c.name): c for c in cities},
    )


# -- the tools --------------------------------------------------------------------

LOOKUP_TOOLS: tuple[Tool, ...] = tuple(tool(f) for f in purchase_world(0).lookups().values())
"""The lookup tools' schemas, made once from `World`'s methods, in the order they are offered
(by the kind of name they take); `purchase_tools` binds them to a seed's world, as env.py
binds the sql tool to a store."""


def purchase_tools(seed: int) -> list[Tool]:
    """The lookup tools, answering from the world of `seed`."""
    bound = purchase_world(seed).lookups()
    return [dataclasses.replace(t, fn=bound[t.name]) for t in LOOKUP_TOOLS]


def same_lookup(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> bool:
    """Whether a lookup's arguments name what the expected ones do; False for non-text."""
    return all(
        isinstance(value := actual.get(key), str) and normalised(value) == normalised(want)
        for key, want in expected.items()
    )


# -- the problems -------------------------------------------------------------------


def lookup(tool_name: str, name: str) -> ToolCall:
    """A call of the lookup `tool_name` on `name`."""
    return ToolCall(tool_name, {LOOKUPS[tool_name]: name})


_ROUNDING = "Round to cents."


def _problem(prompt: str, exact: Decimal, calls: tuple[ToolCall, ...]) -> Problem | None:
    answer = rounded_cents(exact)
    return None if answer is None else Problem(prompt, answer, calls)


def _bought(world: World, item: Item, n: int) -> Problem | None:
    """Level 1: n items at the looked-up price."""
    price = money(item.cents)
    calls = (lookup("price", item.name), calculator_call(f"{n} * {price}"))
    return _problem(f"What do {n} {item.name}s cost?", Decimal(n * item.cents) / 100, calls)


def _discounted(world: World, item: Item, n: int, *, look_up_price: bool) -> Problem | None:
    """Levels 2 and 3: n items less their supplier's discount."""
    supplier, price = world.supplier_of(item.name), money(item.cents)
    factor = 1 - Decimal(supplier.discount) / 100
    calls: tuple[ToolCall, ...] = (
        lookup("supplier", item.name),
        lookup("discount", supplier.name),
    )
    if look_up_price:
        calls += (lookup("price", item.name),)
    calls += (calculator_call(f"{n} * {price} * {factor}"),)
    question = f"What do {n} {item.name}s cost after their supplier's discount? {_ROUNDING}"
    given = "" if look_up_price else f"{item.name.capitalize()}s cost ${price} each. "
    return _problem(given + question, Decimal(n * item.cents) / 100 * factor, calls)


def _taxed_calls(world: World, item: Item) -> tuple[tuple[ToolCall, ...], Decimal]:
    """The lookups from an item to its supplier's city's tax, and the tax multiplier."""
    supplier = world.supplier_of(item.name)
    city = world.find_city(supplier.city)
    calls = (
        lookup("supplier", item.name),
        lookup("city", supplier.name),
        lookup("tax", city.name),
    )
    return calls, 1 + Decimal(city.tax) / 100


def _taxed(world: World, item: Item, n: int) -> Problem | None:
    """Level 4: n items plus the sales tax of their supplier's city."""
    (lookups, multiplier), price = _taxed_calls(world, item), money(item.cents)
    prompt = (
        f"{item.name.capitalize()}s cost ${price} each before tax. What do {n} {item.name}s "
        f"cost with the sales tax of their supplier's city? {_ROUNDING}"
    )
    calls = (*lookups, calculator_call(f"{n} * {price} * {multiplier}"))
    return _problem(prompt, Decimal(n * item.cents) / 100 * multiplier, calls)


def _pair_taxed(world: World, a: Item, b: Item, na: int, nb: int) -> Problem | None:
    """Level 5: na of `a` and nb of `b`, plus the tax of the city of `b`'s supplier."""
    (lookups, multiplier), pa, pb = _taxed_calls(world, b), money(a.cents), money(b.cents)
    prompt = (
        f"{a.name.capitalize()}s cost ${pa} and {b.name}s ${pb} before tax. What do {na} "
        f"{a.name}s and {nb} {b.name}s cost with the sales tax of the {b.name}s' supplier's "
        f"city? {_ROUNDING}"
    )
    calls = (*lookups, calculator_call(f"({na} * {pa} + {nb} * {pb}) * {multiplier}"))
    return _problem(prompt, Decimal(na * a.cents + nb * b.cents) / 100 * multiplier, calls)


def _pairs(seed: int, split: Split) -> list[Problem]:
    """Level 5: one task per ordered pair of the split's items with suppliers in two cities."""
    world, problems = purchase_world(seed), []
    for a in world.split_items(split):
        for b in world.split_items(split):
            if world.supplier_of(a.name).city == world.supplier_of(b.name).city:
                continue  # the same tax either way: nothing to pick
            rng = random.Random(f"agentgym/tool_call/purchase/pair/{seed}/{a.name}/{b.name}")
            counts = [(na, nb) for na in QUANTITIES for nb in QUANTITIES]
            rng.shuffle(counts)
            found = (_pair_taxed(world, a, b, na, nb) for na, nb in counts)
            problems.append(next(p for p in found if p is not None))
    return problems


_SINGLE: dict[int, Callable[[World, Item, int], Problem | None]] = {
    1: _bought,
    2: functools.partial(_discounted, look_up_price=False),
    3: functools.partial(_discounted, look_up_price=True),
    4: _taxed,
}


def purchase_problems(seed: int, split: Split, difficulty: int) -> list[Problem]:
    """Every purchase problem of `split` at `difficulty`, in a fixed order."""
    if difficulty == 5:
        return _pairs(seed, split)
    world, build = purchase_world(seed), _SINGLE[difficulty]
    found = (build(world, item, n) for item in world.split_items(split) for n in QUANTITIES)
    return [p for p in found if p is not None]
