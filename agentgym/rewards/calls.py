"""Function calls judged against the calls a row expects: the matching rules and the rewards.

Published function-calling data (xLAM/APIGen, ToolACE, Hermes, glaive, BFCL) gives the
calls that answer a query in one of two forms; `call_specs` reads both:

- exact calls, `[{"name": "f", "arguments": {"a": 1}}]` (or OpenAI's
  `{"type": "function", "function": {...}}`; arguments an object or its JSON text):
  every listed argument must be given, with its one value;
- acceptable values, `[{"f": {"a": [1, 2], "b": ["x", ""]}}]` (BFCL's possible answers):
  any listed value is right, and `""` in a list means the argument may be left out (so an
  argument whose one right value is the empty string is written in the exact form).

An empty list means the right answer is to call nothing.

## Matching rules

A call matches an expected call (`arguments_match`) when:

1. its name is the expected name, exactly (case counts);
2. it gives every argument the expected call needs (listed, without `""`) and every
   argument the function's schema requires, and no other argument: none the schema
   does not define, none the expected call does not list, except one given with the
   schema's `default` as its value;
3. each value it gives is one of the listed values under the parameter's schema type
   (`value_matches`):
   - "number": an int or a float, equal as numbers (1 and 1.0 agree); not a string, not a bool;
   - "integer": an int written as one (2.0 and true are not integers);
   - "boolean": true or false;
   - "string" (enums too): a string; `string_match="exact"` compares as written, and
     "normalized" after `normalize_string`: casefolded, surrounding whitespace stripped,
     inner runs of whitespace as one space, and the characters in `DROPPED_PUNCTUATION`
     removed (so "New York." matches "new york", and "2025-03-14" does not match
     "2025/03/14");
   - "array": a list of the same length, element by element under "items";
   - "object": an object with the same keys, value by value under "properties";
   - "null": null;
   - no type (`"any"`, or none given): the rule of the expected value's JSON type.

The calls of a turn are paired with the expected calls order-free: each expected call
with at most one call of its name and each call with at most one expected call, the
pairing that pairs the most calls and, among those, matches the most arguments. Calls
left unpaired are extra. The calls match *as a whole* when every expected call is
paired with a call that matches it and no call is extra (for `[]`: no call at all).

## Rewards (`call_parts`)

- "correctness": 1.0 when the calls match as a whole, else 0.0: the strict figure that
  `agentgym eval` reports.
- "tool", `call_reward="seed"`: the seed tutorial's `tool_call_reward` per expected
  call: 0.5 for a call of the right function, 0.5 more when its arguments match;
  summed, minus 0.5 per extra call, over the number of expected calls, at least -1.0;
  -1.0 when calls were expected and none was made. With `[]` expected: 1.0 without a
  call, 0.0 with any.
- "tool", `call_reward="toolrl"`: ToolRL's decomposition (Qian et al. 2025, "ToolRL:
  Reward is All Tool Learning Needs", eq. 5-7), scaled to [0, 1]: the Jaccard overlap of
  the called and expected function names, plus per paired call the Jaccard overlap of
  its argument names (given against needed; an optional argument given counts on both
  sides) and the number of listed arguments with a right value (an optional one left
  out counts as right), over their maximum `1 + expected calls + listed arguments`.
  With `[]` expected: 1.0 without a call, 0.0 with any.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

StringMatch = Literal["exact", "normalized", "bfcl"]
CallReward = Literal["seed", "toolrl"]
STRING_MATCHES: tuple[str, ...] = ("exact", "normalized", "bfcl")
"""`bfcl`: BFCL v4's checker, `agentgym.rewards.bfcl` (`match_calls` compares it as "exact")."""
CALL_REWARDS: tuple[str, ...] = ("seed", "toolrl")

OMIT = ""
"""In an acceptable-values list: the argument may be left out."""
DROPPED_PUNCTUATION = ".,;:!?'\"`"
"""Characters `normalize_string` removes."""
MAX_EXPECTED_CALLS = 10
"""Expected calls a row may hold (the pairing searches their subsets)."""
MAX_JUDGED_CALLS = 64
"""Calls of one turn that are paired; any beyond are extra."""

_SPACES = re.compile(r"\s+")
_DROP = str.maketrans("", "", DROPPED_PUNCTUATION)


@dataclass(frozen=True)
class CallSpec:
    """One expected call: the function's name, the right values of each listed argument,
    and which listed arguments may be left out (`exact`: read from the exact form)."""

    name: str
    values: Mapping[str, tuple[Any, ...]]
    optional: frozenset[str] = frozenset()
    exact: bool = field(default=False, compare=False)

    @property
    def needed(self) -> frozenset[str]:
        """The listed arguments a matching call must give."""
        return frozenset(self.values) - self.optional

    def demonstration(self) -> dict[str, Any]:
        """The call a perfect answer makes: each needed argument's first right value, and
        optional ones only where a value is listed besides `""` (its first)."""
        arguments = {k: v[0] for k, v in self.values.items() if v}
        return {"name": self.name, "arguments": arguments}


# -- reading the expected calls of a row --------------------------------------------------------


def call_specs(items: Sequence[Any]) -> tuple[CallSpec, ...]:
    """The expected calls of a cell's list, in either form; ValueError saying what is wrong
    (which call, which argument) and what is valid."""
    if len(items) > MAX_EXPECTED_CALLS:
        raise ValueError(f"{len(items)} expected calls; valid: at most {MAX_EXPECTED_CALLS}")
    return tuple(_spec(i, item) for i, item in enumerate(items))


def _spec(index: int, item: Any) -> CallSpec:
    valid = (
        "valid: {'name': str, 'arguments': {...}} or {'<function>': {'<argument>': [values...]}}"
    )
    if isinstance(item, Mapping) and isinstance(item.get("function"), Mapping):
        item = item["function"]
    if not isinstance(item, Mapping) or not item:
        raise ValueError(f"call {index} is {_short(item)}; {valid}")
    if "name" in item and isinstance(item["name"], str):
        return _exact(index, item, valid)
    if len(item) != 1:
        raise ValueError(f"call {index} has keys {sorted(map(str, item))[:6]}; {valid}")
    ((name, arguments),) = item.items()
    if not isinstance(arguments, Mapping):
        raise ValueError(f"call {index} ({name!r}): arguments {_short(arguments)}; {valid}")
    values: dict[str, tuple[Any, ...]] = {}
    optional = set()
    for key, listed in arguments.items():
        if not isinstance(listed, list):
            raise ValueError(
                f"call {index} ({name!r}), argument {key!r}: {_short(listed)}; valid: a list "
                "of acceptable values ('' for: may be left out)"
            )
        values[key] = tuple(v for v in listed if not (isinstance(v, str) and v == OMIT))
        if len(values[key]) < len(listed):
            optional.add(key)
    return CallSpec(str(name), values, frozenset(optional))


def _exact(index: int, item: Mapping[str, Any], valid: str) -> CallSpec:
    arguments = item.get("arguments", item.get("parameters"))
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    if not isinstance(arguments, Mapping):
        raise ValueError(
            f"call {index} ({item['name']!r}) has arguments {_short(arguments)}; {valid}"
        )
    return CallSpec(item["name"], {k: (v,) for k, v in arguments.items()}, exact=True)


def spec_problems(spec: CallSpec, parameters: Mapping[str, Any]) -> list[str]:
    """What is wrong with an expected call against its function's (strict) parameters: an
    argument the schema lacks, a required one missing, a listed value of the wrong type."""
    properties = parameters.get("properties") or {}
    where = f"expected call {spec.name!r}"
    problems = [
        f"{where}: argument {k!r} is not among the function's parameters "
        f"({', '.join(properties) or 'none'})"
        for k in spec.values
        if k not in properties
    ]
    missing = [k for k in parameters.get("required") or () if k not in spec.needed]
    if missing:
        problems.append(
            f"{where}: the schema requires {missing}, which the call does not give (or lists "
            "as optional)"
        )
    for key, listed in spec.values.items():
        schema = properties.get(key)
        for value in listed:
            if key in properties and not value_matches(value, value, schema, "exact"):
                problems.append(
                    f"{where}: argument {key!r} lists {_short(value)}, not a value of its "
                    f"type {_type_name(schema)}"
                )
    return problems


# -- matching -------------------------------------------------------------------------------


def normalize_string(text: str) -> str:
    """`text` casefolded, stripped, inner whitespace runs as one space, and the characters
    of `DROPPED_PUNCTUATION` removed."""
    return _SPACES.sub(" ", text.translate(_DROP).casefold()).strip()


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return "null" if value is None else "unknown"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def value_matches(expected: Any, actual: Any, schema: Any, string_match: StringMatch) -> bool:
    """Whether `actual` is the value `expected` under `schema`'s type (see the module)."""
    schema = schema if isinstance(schema, Mapping) else {}
    kind = schema.get("type")
    if isinstance(kind, list):
        return any(
            value_matches(expected, actual, {**schema, "type": k}, string_match) for k in kind
        )
    if not isinstance(kind, str):
        kind = _json_kind(expected)
    if kind in ("number", "integer"):
        if not (_is_number(actual) and _is_number(expected)):
            return False
        return bool(actual == expected) and (kind == "number" or isinstance(actual, int))
    if kind == "boolean":
        return isinstance(actual, bool) and actual == expected
    if kind == "string":
        if not (isinstance(actual, str) and isinstance(expected, str)):
            return False
        if string_match == "normalized":
            return normalize_string(actual) == normalize_string(expected)
        return actual == expected
    if kind == "array":
        items = schema.get("items")
        return (
            isinstance(actual, list | tuple)
            and isinstance(expected, list | tuple)
            and len(actual) == len(expected)
            and all(
                value_matches(e, a, items, string_match)
                for e, a in zip(expected, actual, strict=True)
            )
        )
    if kind == "object":
        if not (isinstance(actual, Mapping) and isinstance(expected, Mapping)):
            return False
        properties = schema.get("properties") or {}
        return set(actual) == set(expected) and all(
            value_matches(expected[k], actual[k], properties.get(k), string_match) for k in expected
        )
    if kind == "null":
        return actual is None and expected is None
    return False


@dataclass(frozen=True)
class ArgumentCheck:
    """How a call's arguments fare against an expected call's: whether they match (rule
    2 and 3), and ToolRL's figures (argument-name overlap, listed arguments right)."""

    matches: bool
    name_overlap: float
    values_right: int


def arguments_match(
    spec: CallSpec,
    arguments: Mapping[str, Any],
    parameters: Mapping[str, Any],
    string_match: StringMatch,
) -> ArgumentCheck:
    """The arguments of a call of `spec.name` checked against `spec` (see the module)."""
    properties = parameters.get("properties") or {}
    required = set(parameters.get("required") or ()) | spec.needed
    given = set(arguments)
    right = {
        k
        for k, listed in spec.values.items()
        if (k not in given and k in spec.optional)
        or (
            k in given
            and any(value_matches(v, arguments[k], properties.get(k), string_match) for v in listed)
        )
    }
    unlisted_ok = all(
        k in spec.values
        or (
            isinstance(properties.get(k), Mapping)
            and "default" in properties[k]
            and value_matches(properties[k]["default"], arguments[k], properties[k], string_match)
        )
        for k in given
    )
    matches = required <= given and unlisted_ok and right == set(spec.values)
    union = given | required
    overlap = len(given & (set(spec.values) | required)) / len(union) if union else 1.0
    return ArgumentCheck(matches, overlap, len(right))


@dataclass(frozen=True)
class CallMatch:
    """A turn's calls paired with the expected calls.

    `pairs` holds (expected index, call index, its `ArgumentCheck`); `extra` counts the
    calls left unpaired; `names` are the (expected, called) function names.
    """

    expected: tuple[CallSpec, ...]
    calls: int
    pairs: tuple[tuple[int, int, ArgumentCheck], ...]
    names: tuple[frozenset[str], frozenset[str]]

    @property
    def extra(self) -> int:
        return self.calls - len(self.pairs)

    @property
    def whole(self) -> bool:
        """Every expected call paired with a matching call, and no call extra."""
        return (
            len(self.pairs) == len(self.expected)
            and self.extra == 0
            and all(check.matches for _, _, check in self.pairs)
        )


def match_calls(
    expected: Sequence[CallSpec],
    calls: Sequence[tuple[str, Mapping[str, Any]]],
    parameters: Mapping[str, Mapping[str, Any]],
    string_match: StringMatch = "exact",
) -> CallMatch:
    """The turn's `calls` ((name, arguments) each) paired with `expected`, order-free.

    `parameters` maps each offered function to its (strict) parameters schema.
    """
    judged = list(calls)[:MAX_JUDGED_CALLS]
    pairs: list[tuple[int, int, ArgumentCheck]] = []
    for name in dict.fromkeys(s.name for s in expected):
        rows = [i for i, s in enumerate(expected) if s.name == name]
        cols = [j for j, (called, _) in enumerate(judged) if called == name]
        checks = {
            (i, j): arguments_match(
                expected[i], judged[j][1], parameters.get(name) or {}, string_match
            )
            for i in rows
            for j in cols
        }
        for i, j in _best_pairing(rows, cols, checks):
            pairs.append((i, j, checks[i, j]))
    names = (frozenset(s.name for s in expected), frozenset(n for n, _ in calls))
    return CallMatch(tuple(expected), len(calls), tuple(sorted(pairs)), names)


def _best_pairing(
    rows: Sequence[int], cols: Sequence[int], checks: Mapping[tuple[int, int], ArgumentCheck]
) -> list[tuple[int, int]]:
    """The pairing of `rows` with `cols` (at most once each) that pairs the most, then
    matches the most, then gets the most values right: a search over the rows' subsets,
    one column at a time (rows are at most MAX_EXPECTED_CALLS)."""

    def weight(i: int, j: int) -> float:
        check = checks[i, j]
        return 1_000_000 + 1_000 * check.matches + check.values_right

    best: dict[int, tuple[float, tuple[tuple[int, int], ...]]] = {0: (0.0, ())}
    for j in cols:
        step = dict(best)
        for mask, (score, chosen) in best.items():
            for bit, i in enumerate(rows):
                if mask >> bit & 1:
                    continue
                key, value = mask | 1 << bit, score + weight(i, j)
                if key not in step or value > step[key][0]:
                    step[key] = (value, (*chosen, (i, j)))
        best = step
    return list(max(best.values(), key=lambda entry: entry[0])[1])


# -- rewards --------------------------------------------------------------------------------


def seed_tool_part(match: CallMatch) -> float:
    """The seed tutorial's tool part, per expected call, extra calls subtracting."""
    if not match.expected:
        return 1.0 if match.calls == 0 else 0.0
    if match.calls == 0:
        return -1.0
    paid = sum(0.5 + 0.5 * check.matches for _, _, check in match.pairs)
    return max(-1.0, (paid - 0.5 * match.extra) / len(match.expected))


def toolrl_tool_part(match: CallMatch) -> float:
    """ToolRL's name, argument-name and value terms over their maximum, in [0, 1]."""
    if not match.expected:
        return 1.0 if match.calls == 0 else 0.0
    wanted, called = match.names
    names = len(wanted & called) / len(wanted | called)
    pairs = sum(check.name_overlap + check.values_right for _, _, check in match.pairs)
    most = 1 + len(match.expected) + sum(len(s.values) for s in match.expected)
    return (names + pairs) / most


def call_parts(match: CallMatch, call_reward: CallReward = "seed") -> dict[str, float]:
    """The "correctness" and "tool" reward parts of a turn's calls (see the module)."""
    tool = seed_tool_part(match) if call_reward == "seed" else toolrl_tool_part(match)
    return {"correctness": float(match.whole), "tool": tool}


def _type_name(schema: Any) -> str:
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    return json.dumps(kind) if kind is not None else "any"


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= limit else text[: limit - 3] + "..."
