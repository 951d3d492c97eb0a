"""The world's building blocks: the kinds of parameter values (their schema, a random
value, how a query says it) and the API table of `vocabulary.API_TABLE`, read into `APIS`."""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from agentgym.envs.function_calls.vocabulary import API_TABLE, WORDS

DRAWS = 50  # tries at a fresh value before giving up loudly

# -- kinds: a parameter's type --------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """A parameter's type: its JSON Schema, how to draw a value, and how a query says one."""

    schema: Mapping[str, Any]
    draw: Callable[[random.Random], Any]
    say: Callable[[Any], str] = str

    @property
    def nested(self) -> bool:
        """Whether a value is a list or an object."""
        return self.schema.get("type") in ("array", "object")


def text(words: Sequence[str]) -> Kind:
    return Kind({"type": "string"}, lambda rng: rng.choice(words))


def made(draw: Callable[[random.Random], str]) -> Kind:
    return Kind({"type": "string"}, draw)


def code(pattern: str) -> Kind:
    """Strings like `pattern`, each "#" a digit and each "@" a capital letter."""
    pick = {"#": string.digits, "@": "ABCDEFGHJKLMNPQRSTUVWXYZ"}
    return made(lambda rng: "".join(rng.choice(pick[c]) if c in pick else c for c in pattern))


def integer(low: int, high: int) -> Kind:
    schema = {"type": "integer", "minimum": low, "maximum": high}
    return Kind(schema, lambda rng: rng.randint(low, high))


def number(low: float, high: float, step: float) -> Kind:
    """Numbers from `low` to `high` in steps of `step`; whole ones as ints ("5", not "5.0")."""

    def draw(rng: random.Random) -> float:
        value = round(low + step * rng.randint(0, round((high - low) / step)), 2)
        return int(value) if value == int(value) else value

    return Kind({"type": "number", "minimum": low, "maximum": high}, draw)


FLAG = Kind({"type": "boolean"}, lambda rng: True, lambda value: "")
"""An optional switch, false by default: a query that mentions it turns it on."""


def spoken(items: Sequence[str]) -> str:
    """Items as a sentence lists them: "a, b and c"."""
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else items[0]


def listof(item: Kind, low: int, high: int, quote: bool) -> Kind:
    """Lists of `low` to `high` distinct `item`s, said "a, b and c" (or "'a', 'b' and 'c'")."""

    def draw(rng: random.Random) -> list[Any]:
        n = rng.randint(low, high)
        values: dict[str, Any] = {}
        for _ in range(DRAWS):
            value = item.draw(rng)
            values.setdefault(json.dumps(value), value)
            if len(values) == n:
                return list(values.values())
        raise RuntimeError(f"no {n} distinct values in {DRAWS} draws of {item.schema}")

    def say(values: list[Any]) -> str:
        return spoken([f"'{item.say(v)}'" if quote else item.say(v) for v in values])

    return Kind({"type": "array", "items": item.schema}, draw, say)


def record(template: str, props: Sequence[Param]) -> Kind:
    """Objects of the properties `props` (all required), said by `template`."""
    schema = {
        "type": "object",
        "properties": {p.name: {**p.kind.schema, "description": p.description} for p in props},
        "required": [p.name for p in props],
    }

    def say(value: Mapping[str, Any]) -> str:
        return template.format(**{p.name: p.kind.say(value[p.name]) for p in props})

    return Kind(schema, lambda rng: {p.name: p.kind.draw(rng) for p in props}, say)


def _day(rng: random.Random) -> str:
    return (date(2025, 1, 1) + timedelta(days=rng.randrange(730))).isoformat()


def _handles(template: str) -> tuple[str, ...]:
    """`template` filled with each person's first and last name, lower case."""
    return tuple(template.format(*n.lower().split()) for n in WORDS["person"])


KINDS: Mapping[str, Kind] = {
    "date": made(_day),
    "time": made(lambda rng: f"{rng.randint(7, 21):02d}:{rng.choice((0, 15, 30, 45)):02d}"),
    "month": made(lambda rng: f"{rng.choice((2024, 2025))}-{rng.randint(1, 12):02d}"),
    "phone": code("+1-555-01##"),
    "account": code("ACC-######"),
    "sku": code("SKU-#####"),
    "email": text(_handles("{}.{}@example.com")),
    "username": text(_handles("@{}_{}")),
    "street": made(lambda rng: f"{rng.randint(1, 250)} {rng.choice(WORDS['street_name'])}"),
    "url": made(
        lambda rng: f"https://{rng.choice(WORDS['url_host'])}/{rng.choice(WORDS['url_path'])}"
    ),
    "seat": made(lambda rng: rng.choice("ABCDEFGH") + str(rng.randint(1, 20))),
    "course": made(lambda rng: rng.choice(WORDS["course_prefix"]) + str(rng.randint(100, 499))),
}
"""Kinds the table names that no word list holds: values made up as they are drawn."""


# -- the API table --------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One parameter of a function; optional when it has a default."""

    name: str
    kind: Kind
    description: str
    default: Any = None
    say: str = "{}"  # how a query mentions an optional value: "in {}"

    @property
    def required(self) -> bool:
        return self.default is None


@dataclass(frozen=True)
class Function:
    """One function of an API family, named without its family."""

    name: str
    description: str
    params: tuple[Param, ...]
    templates: tuple[str, ...]

    @property
    def nested(self) -> bool:
        """Whether some parameter takes a list or an object."""
        return any(p.kind.nested for p in self.params)


@dataclass(frozen=True)
class Family:
    """An API family: functions about one domain."""

    name: str
    functions: tuple[Function, ...]


_PARAM = re.compile(r'(\w+): (.+?)(?: = (.+?) "([^"]*)")? \| (.+)')
_RANGE = re.compile(r"(\d+)-(\d+) (.+)")


def numeral(word: str) -> int | float:
    return float(word) if "." in word else int(word)


def kind_of(spec: str) -> Kind:
    """The kind a type in `API_TABLE` names (all but `record`, which `params` reads)."""
    head, _, rest = spec.partition(" ")
    if head == "int":
        return integer(*(int(w) for w in rest.split()))
    if head == "num":
        return number(*(numeral(w) for w in rest.split()))
    if head == "enum":
        words = WORDS.get(rest) or tuple(w.strip() for w in rest.split(","))
        return Kind({"type": "string", "enum": list(words)}, lambda rng: rng.choice(words))
    if head in ("list", "qlist"):
        sized = _RANGE.fullmatch(rest)
        fewest, most = (int(sized[1]), int(sized[2])) if sized else (2, 4)
        item = kind_of(sized[3] if sized else rest)
        return listof(item, fewest, most, quote=head == "qlist")
    if head == "code":
        return code(rest)
    if head == "any":
        return Kind({}, lambda rng: rng.choice(WORDS[rest]))
    if spec == "flag":
        return FLAG
    if spec in KINDS:
        return KINDS[spec]
    if spec in WORDS:
        return text(WORDS[spec])
    raise ValueError(f"API_TABLE: no type {spec!r}")


def default_of(word: str) -> Any:
    """A default as the table writes it: JSON (3, 6.5, false) or else a plain string."""
    try:
        return json.loads(word)
    except json.JSONDecodeError:
        return word


Lines = list[tuple[int, str]]  # (indent, text) of the table's non-blank lines


def params(lines: Lines, at: int, indent: int) -> tuple[tuple[Param, ...], int]:
    """The parameters written from `lines[at]` at `indent`, and the index after them."""
    found: list[Param] = []
    while at < len(lines) and lines[at][0] == indent and not lines[at][1].startswith(">"):
        match = _PARAM.fullmatch(lines[at][1])
        if match is None:
            raise ValueError(f"API_TABLE: not a parameter: {lines[at][1]!r}")
        name, spec, default, say, description = match.groups()
        at += 1
        if spec.startswith("record "):
            props, at = params(lines, at, indent + 2)
            kind = record(spec.removeprefix("record "), props)
        else:
            kind = kind_of(spec)
        value = None if default is None else default_of(default)
        found.append(Param(name, kind, description, value, say or "{}"))
    return tuple(found), at


def read_table(table: str) -> tuple[Family, ...]:
    """The API families written in `table` (see `vocabulary` for how)."""
    lines = [(len(s) - len(s.lstrip()), s.strip()) for s in table.splitlines() if s.strip()]
    families: list[Family] = []
    at = 0
    while at < len(lines):
        family, functions = lines[at][1].strip("[]"), []
        at += 1
        while at < len(lines) and lines[at][0] == 2:
            name, description = lines[at][1].split(": ", 1)
            found, at = params(lines, at + 1, 4)
            templates = []
            while at < len(lines) and lines[at][1].startswith(">"):
                templates += [t.strip() for t in lines[at][1][1:].split(" | ")]
                at += 1
            functions.append(Function(name, description, found, tuple(templates)))
        families.append(Family(family, tuple(functions)))
    return tuple(families)


APIS: tuple[Family, ...] = read_table(API_TABLE)
"""The API families, in the table's order; `apis(seed)` names them and splits them."""
