"""A seeded world of function-calling tasks, in the shape of published data; nothing downloaded.

Each row is what a row of xLAM/APIGen or BFCL holds: the user's query, the
function schemas offered with it, and the calls that answer it, as
acceptable values (BFCL's form): per call `{name: {argument: [values]}}`, any
listed value right, `""` meaning the argument may be left out (an optional
parameter the query does not mention: `[default, ""]`); `[]` means the right
answer is to call nothing.

`APIS` (read from `vocabulary.API_TABLE`) holds 43 API families of 2 to 4
typed functions. `apis(seed)` is a seed's world: it names every function
(`weather.get_forecast` or `weather_get_forecast`, per family) and puts a
quarter of the families in the test split, the rest in train. A row offers
only functions of its split's families, distractors included, so no test row
shows a train family's schema.

Levels, each its own kind of task:

1. "simple": one function offered, one call;
2. "multiple": four offered (one right, three from other families), one call;
3. "parallel": two or three calls in one turn, of one function with different
   values or of different functions, among two to four offered;
4. a third of rows "irrelevance" (four functions, none of the query's family
   nor of a family `vocabulary.NEAR_FAMILIES` puts near it, so the answer is
   no call), the rest as level 2;
5. "nested": a list or an object argument, among two or three distractors.

Levels 1 to 4 ask only flat functions (scalar parameters); level 5 only nested
ones. A query mentions each optional parameter with chance `MENTION_SHARE` (never
in parallel rows of one function, where one sentence's option would read as
the other's too), and a mentioned value is never the default. A quarter of
rows (`LOOSE_SHARE`) write their schemas as published data often does: the
bare `{"name", "description", "parameters"}` form, with "dict", "float",
"tuple" and "any" for object, number, array and an unconstrained value; the
env normalises them.
"""

from __future__ import annotations

import copy
import functools
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, cast

from agentgym.env.core import SPLITS, Split, check_difficulty
from agentgym.envs.function_calls.apis import (
    APIS,
    DRAWS,
    Function,
    Param,
)
from agentgym.envs.function_calls.vocabulary import NEAR_FAMILIES

LEVELS = 5
ROWS: Mapping[Split, int] = {"train": 5000, "test": 500}
"""Rows per level of each split, made lazily by index."""
TEST_SHARE = 0.25  # of the API families
LOOSE_SHARE = 0.25  # of rows, whose schemas take the loose style
MENTION_SHARE = 0.35  # chance that a query mentions an optional parameter
IRRELEVANT_SHARE = 1 / 3  # of level 4 rows
NAME_STYLES = ("{family}.{function}", "{family}_{function}")
LOOSE_TYPES = {"object": "dict", "number": "float", "array": "tuple"}

Category = Literal["simple", "multiple", "parallel", "irrelevance", "nested"]


# -- a seed's world -------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiFunction:
    """A function as a seed's world offers it: named with its family."""

    name: str
    family: str
    function: Function


@dataclass(frozen=True)
class World:
    """One seed's API families: each one's split, and every function by its tool name."""

    seed: int
    splits: Mapping[str, Split]
    functions: Mapping[str, ApiFunction]

    def split_functions(self, split: Split) -> list[ApiFunction]:
        """The functions of the families in `split`, in the table's order."""
        return [f for f in self.functions.values() if self.splits[f.family] == split]


@functools.lru_cache(maxsize=64)
def apis(seed: int) -> World:
    """The world of `seed`: which families are test families and how functions are named."""
    rng = random.Random(f"agentgym/function_calls/world/{seed}")
    order = rng.sample([f.name for f in APIS], len(APIS))
    tests = set(order[: round(len(APIS) * TEST_SHARE)])
    functions: dict[str, ApiFunction] = {}
    for family in APIS:
        style = rng.choice(NAME_STYLES)
        for f in family.functions:
            name = style.format(family=family.name, function=f.name)
            functions[name] = ApiFunction(name, family.name, f)
    splits: dict[str, Split] = {f.name: "test" if f.name in tests else "train" for f in APIS}
    return World(seed, splits, functions)


# -- schemas --------------------------------------------------------------------------------


def parameters_schema(function: Function) -> dict[str, Any]:
    """The JSON Schema object of `function`'s parameters (a fresh copy)."""
    properties = {}
    for p in function.params:
        schema = {**copy.deepcopy(dict(p.kind.schema)), "description": p.description}
        if not p.required:
            schema["default"] = p.default
        properties[p.name] = schema
    required = [p.name for p in function.params if p.required]
    return {"type": "object", "properties": properties, "required": required}


def loosened(schema: Mapping[str, Any]) -> dict[str, Any]:
    """`schema` with the type names of published data: dict, float, tuple; "any" for none."""
    out = {"type": LOOSE_TYPES.get(schema["type"], schema["type"]) if "type" in schema else "any"}
    out |= {key: value for key, value in schema.items() if key != "type"}
    if "properties" in schema:
        out["properties"] = {k: loosened(v) for k, v in schema["properties"].items()}
    if "items" in schema:
        out["items"] = loosened(schema["items"])
    return out


def tool_schema(api: ApiFunction, loose: bool = False) -> dict[str, Any]:
    """The schema a row offers `api` by: OpenAI's tool form, or the bare loose one."""
    parameters = parameters_schema(api.function)
    if loose:
        return {
            "name": api.name,
            "description": api.function.description,
            "parameters": loosened(parameters),
        }
    described = {"name": api.name, "description": api.function.description}
    return {"type": "function", "function": {**described, "parameters": parameters}}


# -- rows -----------------------------------------------------------------------------------


class Row(TypedDict):
    """One task, as published function-calling data writes it."""

    prompt: str
    tools: list[dict[str, Any]]
    expected_calls: list[dict[str, dict[str, list[Any]]]]
    category: Category
    level: int
    api: str  # the family the query is about


@dataclass(frozen=True)
class Call:
    """One call a query asks for: its acceptable values, and the sentence that asks it."""

    api: ApiFunction
    arguments: Mapping[str, list[Any]]
    sentence: str


@dataclass(frozen=True)
class Task:
    """What a level builds: the query, the right calls (none for irrelevance), the offer."""

    prompt: str
    calls: tuple[Call, ...]
    offered: tuple[ApiFunction, ...]
    category: Category
    api: str


def fresh(param: Param, rng: random.Random, said: set[str]) -> Any:
    """A value of `param` that the query has not said yet and, if optional, not its default."""
    for _ in range(DRAWS):
        value = param.kind.draw(rng)
        surface = param.kind.say(value)
        if (not surface or surface not in said) and (param.required or value != param.default):
            said.add(surface)
            return value
    raise RuntimeError(f"no fresh value of {param.name!r} in {DRAWS} draws")


def draw_call(api: ApiFunction, template: str, rng: random.Random, mention: float) -> Call:
    """A call of `api` asked by `template`, each optional parameter mentioned with `mention`."""
    arguments: dict[str, list[Any]] = {}
    slots: dict[str, str] = {}
    mentions: list[str] = []
    said: set[str] = set()
    for p in api.function.params:
        if not p.required and rng.random() >= mention:
            arguments[p.name] = [p.default, ""]
            continue
        value = fresh(p, rng, said)
        arguments[p.name] = [value]
        if p.required:
            slots[p.name] = p.kind.say(value)
        else:
            mentions.append(p.say.format(p.kind.say(value)))
    sentence = template.format(**slots)
    if mentions:  # before the final punctuation
        sentence = f"{sentence[:-1]} {' '.join(mentions)}{sentence[-1]}"
    return Call(api, arguments, sentence)


def one_call(api: ApiFunction, rng: random.Random) -> Call:
    return draw_call(api, rng.choice(api.function.templates), rng, MENTION_SHARE)


def repeated_calls(api: ApiFunction, n: int, rng: random.Random) -> list[Call]:
    """`n` calls of `api` with different arguments, each asked by a different template."""
    calls: list[Call] = []
    for template in rng.sample(api.function.templates, n):
        for _ in range(DRAWS):
            call = draw_call(api, template, rng, mention=0)
            if all(call.arguments != c.arguments for c in calls):
                calls.append(call)
                break
        else:
            raise RuntimeError(f"no {n} different calls of {api.name} in {DRAWS} draws")
    return calls


def distractors(
    pool: Sequence[ApiFunction], rng: random.Random, avoid: set[str], n: int
) -> list[ApiFunction]:
    """`n` functions of `pool`, each of a different family and none of the families `avoid`."""
    families = sorted({f.family for f in pool} - avoid)
    return [rng.choice([f for f in pool if f.family == fam]) for fam in rng.sample(families, n)]


def offer(rng: random.Random, *groups: Sequence[ApiFunction]) -> tuple[ApiFunction, ...]:
    """The functions of `groups`, shuffled, so the right one is not always first."""
    together = [f for group in groups for f in group]
    return tuple(rng.sample(together, len(together)))


def flat(pool: Sequence[ApiFunction]) -> list[ApiFunction]:
    return [f for f in pool if not f.function.nested]


def simple(pool: Sequence[ApiFunction], rng: random.Random) -> Task:
    """Level 1: one function offered, one call."""
    call = one_call(rng.choice(flat(pool)), rng)
    return Task(call.sentence, (call,), (call.api,), "simple", call.api.family)


def multiple(pool: Sequence[ApiFunction], rng: random.Random) -> Task:
    """Level 2: one call, among three distractors from other families."""
    call = one_call(rng.choice(flat(pool)), rng)
    offered = offer(rng, [call.api], distractors(pool, rng, {call.api.family}, 3))
    return Task(call.sentence, (call,), offered, "multiple", call.api.family)


def parallel(pool: Sequence[ApiFunction], rng: random.Random) -> Task:
    """Level 3: two or three calls of one function or of several, among 2 to 4 offered."""
    n = rng.choice((2, 3))
    if rng.random() < 0.5:
        calls = repeated_calls(rng.choice(flat(pool)), n, rng)
    else:
        calls = [one_call(f, rng) for f in rng.sample(flat(pool), n)]
    called = list({c.api.name: c.api for c in calls}.values())
    extra = rng.randint(max(2, len(called)), 4) - len(called)
    offered = offer(rng, called, distractors(pool, rng, {f.family for f in called}, extra))
    prompt = " ".join(c.sentence for c in calls)
    return Task(prompt, tuple(calls), offered, "parallel", calls[0].api.family)


def near(family: str) -> set[str]:
    """`family` and the families whose functions might be taken to do what its functions do."""
    return {family}.union(*(group for group in NEAR_FAMILIES if family in group))


def mixed(pool: Sequence[ApiFunction], rng: random.Random) -> Task:
    """Level 4: a third of rows ask what no offered function does (nor one of a family
    `near` the query's); the rest as level 2."""
    if rng.random() >= IRRELEVANT_SHARE:
        return multiple(pool, rng)
    asked = one_call(rng.choice(flat(pool)), rng)
    offered = offer(rng, distractors(pool, rng, near(asked.api.family), 4))
    return Task(asked.sentence, (), offered, "irrelevance", asked.api.family)


def nested(pool: Sequence[ApiFunction], rng: random.Random) -> Task:
    """Level 5: a call with a list or object argument, among two or three distractors."""
    call = one_call(rng.choice([f for f in pool if f.function.nested]), rng)
    others = distractors(pool, rng, {call.api.family}, rng.randint(2, 3))
    return Task(call.sentence, (call,), offer(rng, [call.api], others), "nested", call.api.family)


BUILDERS: Mapping[int, Callable[[Sequence[ApiFunction], random.Random], Task]] = {
    1: simple,
    2: multiple,
    3: parallel,
    4: mixed,
    5: nested,
}


def check_split(split: Any) -> Split:
    """`split` if it is "train" or "test"; ValueError naming the valid ones otherwise."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}; valid: 'train' or 'test'")
    return cast(Split, split)


def num_rows(split: str, level: int) -> int:
    """How many rows `split` holds at `level` (ValueError for a bad split or difficulty)."""
    split = check_split(split)
    check_difficulty(level, LEVELS)
    return ROWS[split]


def row(seed: int, split: str, level: int, index: int) -> Row:
    """Row `index` of `split` at difficulty `level` in the world of `seed`; the same every time.

    Raises:
        ValueError: naming `seed`, `split`, `difficulty` or `index` and its valid range.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed={seed!r}; valid: an int")
    n = num_rows(split, level)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
        raise ValueError(f"index={index!r}; valid: an int from 0 to {n - 1}")
    split = check_split(split)
    rng = random.Random(f"agentgym/function_calls/row/{seed}/{split}/{level}/{index}")
    loose = rng.random() < LOOSE_SHARE
    task = BUILDERS[level](apis(seed).split_functions(split), rng)
    return Row(
        prompt=task.prompt,
        tools=[tool_schema(f, loose) for f in task.offered],
        expected_calls=[{c.api.name: copy.deepcopy(dict(c.arguments))} for c in task.calls],
        category=task.category,
        level=level,
        api=task.api,
    )


def demonstration(row: Row) -> list[dict[str, Any]]:
    """The calls a perfect answer makes: each argument's first acceptable value, "" left out."""
    return [
        {
            "name": name,
            "arguments": {k: copy.deepcopy(v[0]) for k, v in arguments.items() if v[0] != ""},
        }
        for call in row["expected_calls"]
        for name, arguments in call.items()
    ]
