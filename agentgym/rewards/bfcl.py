"""`string_match: bfcl`: calls judged as BFCL v4's AST checker judges them, rule for rule.

A port of `ast_checker` (Python language) from bfcl-eval 2026.3.23,
`bfcl_eval/eval_checker/ast_eval/ast_checker.py`, on the same Python values, so that
its verdict is BFCL's; `tests/test_bfcl_agreement.py` compares the two on perturbed
calls. Its rules, where they differ from `agentgym.rewards.calls`' own:

- **Strings** (`standardize_string`): lowercased, spaces and `, . / - _ * ^` deleted,
  `'` read as `"`, on the call's value and on each listed string; so "San-Francisco"
  matches "San Francisco" and "Los Angeles!" does not match "Los Angeles".
- **Types** (`param_error`): the schema's type is BFCL's (`string`, `integer`, `float`,
  `boolean`, `array`, `tuple`, `dict`, `any`; JSON Schema's names and none read as
  `STRICT_KINDS` says, so a strict schema judges as the BFCL docs it came from). An int
  is accepted for a float; a value of the type of the first listed value is accepted
  too (BFCL's "variable", then compared as written, without normalisation); `true` is
  not an integer, `2.0` is not an integer. Array items' types are checked one level deep.
- **Defaults both ways**: an argument the expected call does not list is an
  "Unexpected parameter" even when it equals the schema's default; one listed with `""`
  may be left out, and `""` given for it is accepted (`[]` for an array, where BFCL's
  list check reads `""` as an empty list).
- **Nested acceptable values**: a `dict` parameter lists `{"key": [values]}` objects,
  a list of `dict`s lists `[{"key": [values]}, ...]`; keys listed with `""` may be
  left out. `null` is a listed value like any other.
- **Pairing** (`bfcl_verdict`): as many calls as expected calls; then BFCL's greedy
  order: each expected call, in order, takes the first unused call that matches it.
  This is kept where it is wrong: with overlapping acceptable values an earlier
  expected call can take the call a later one needed, and the row fails although a
  pairing exists (`tests/test_bfcl_match.py` shows one). No expected call (BFCL's
  irrelevance categories): right exactly when nothing is called.
- **Where BFCL's checker raises** (a listed value its code cannot read, such as `null`
  among the values of an array or a dict parameter), BFCL's own run stops with the
  exception; here the call scores 0 and the error names the exception.

Expected calls in the exact form (`{"name", "arguments"}`) are read as the acceptable
values `[value]`, an object's keys as `{"key": [value]}`; so is a listed object (or list
of objects) one of whose values is not a list (agentgym's own rows write objects as they
are; BFCL's never do). Names are compared exactly:
BFCL's `underscore_to_dot` renaming applies only to the vendor APIs that forbid dots.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym.rewards.calls import (
    OMIT,
    ArgumentCheck,
    CallMatch,
    CallReward,
    CallSpec,
    call_parts,
)

CATEGORIES: tuple[str, ...] = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_irrelevance",
)
"""BFCL v4's single-turn categories its Python AST checker (or irrelevance) scores, in order."""

PYTHON_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
"""BFCL's `PYTHON_TYPE_MAPPING`: the Python type of each of its type names."""
STRICT_KINDS: dict[str, str] = {"number": "float", "object": "dict", "null": "any"}
"""JSON Schema type names as BFCL's (`strict_schema` maps BFCL's the other way); a schema
without a type, or of a type BFCL lacks, is BFCL's `any`."""
CHECKER_ERRORS: tuple[type[Exception], ...] = (TypeError, AttributeError, KeyError, IndexError)
"""What BFCL's checker raises on values its code cannot read."""

_STANDARDIZE = re.compile(r"[ \,\.\/\-\_\*\^]")


@dataclass(frozen=True)
class Verdict:
    """BFCL's verdict on a turn's calls: valid or not, and its error message."""

    valid: bool
    error: str = ""


def standardize_string(text: str) -> str:
    """BFCL's `standardize_string`: spaces and `,./-_*^` deleted, lowercased, `'` as `"`."""
    return _STANDARDIZE.sub("", text).lower().replace("'", '"')


def _std(value: Any) -> Any:
    return standardize_string(value) if type(value) is str else value


def bfcl_kind(schema: Any) -> str:
    """BFCL's type name of a parameter's schema (BFCL's own names, or JSON Schema's)."""
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if not isinstance(kind, str):
        return "any"
    kind = STRICT_KINDS.get(kind, kind)
    return kind if kind in PYTHON_TYPES else "any"


def as_acceptable(value: Any) -> Any:
    """An exact-form value as BFCL lists it: an object's values each as a one-value list,
    a list of objects object by object; anything else as it is."""
    if isinstance(value, Mapping):
        return {k: [as_acceptable(v)] for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        return [as_acceptable(v) for v in value]
    return value


def _literal(value: Any) -> bool:
    """Whether a listed object, or list of objects, is written as its value, not in BFCL's
    nested form (some key's value not a list of acceptable values)."""
    if isinstance(value, Mapping):
        return not all(isinstance(v, list) for v in value.values())
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, Mapping) for v in value)
        and any(map(_literal, value))
    )


def listed_values(spec: CallSpec, key: str) -> list[Any]:
    """The acceptable values of `spec`'s argument `key` as BFCL lists them (`""`: optional)."""
    values = [as_acceptable(v) if spec.exact or _literal(v) else v for v in spec.values[key]]
    return [*values, OMIT] if key in spec.optional else values


# -- one argument ---------------------------------------------------------------------------


def _answer_type(listed: Sequence[Any]) -> type | None:
    """BFCL's `get_possible_answer_type`: the type of the first value that is not `""`."""
    return next((type(a) for a in listed if a != OMIT), None)


def _type_ok(value: Any, listed: Any, expected: type, nested: type | None) -> str:
    """BFCL's `type_checker`: "" when the type is right, "variable" when it is the first
    listed value's type instead, else the error."""
    answer_type = _answer_type(listed)
    variable = answer_type is not None and answer_type is not expected
    elements: Any = value  # a list where `nested` is given
    if type(value) is expected:
        if nested is None:
            return "variable" if variable else ""
        for item in listed:
            if type(item) is not list or all(
                _type_ok(v, item, nested, None) in ("", "variable") for v in elements
            ):
                return "variable" if variable else ""
        return f"Nested type checking failed. Expected inner type {nested.__name__}."
    if answer_type is not None and type(value) is answer_type:
        return "variable"
    return f"Incorrect type. Expected type {expected.__name__}, got {type(value).__name__}."


def _dict_ok(value: Mapping[str, Any], possible: Sequence[Any]) -> bool:
    """BFCL's `dict_checker`: `value` matches one listed `{"key": [values]}` object."""
    for answer in possible:
        if answer == OMIT:
            continue
        flag = True
        for key, item in value.items():
            if key not in answer:
                flag = False
                break
            listed = answer[key]
            if _std(item) not in [_std(listed[i]) for i in range(len(listed))]:
                flag = False
                break
        for key, item in answer.items():
            if key not in value and OMIT not in item:
                flag = False
                break
        if flag:
            return True
    return False


def _list_dict_ok(value: Sequence[Any], possible: Sequence[Any]) -> bool:
    """BFCL's `list_dict_checker`: object by object against one listed list, in order."""
    for answer in possible:
        if len(value) == len(answer) and all(
            _dict_ok(item, [answer[i]]) for i, item in enumerate(value)
        ):
            return True
    return False


def _value_ok(value: Any, listed: Sequence[Any], expected: type, nested: type | None) -> bool:
    """BFCL's value checks, by the parameter's type, once the type is right."""
    if expected is dict:
        return _dict_ok(value, listed)
    if expected is list and nested is dict:
        return _list_dict_ok(value, listed)
    if expected is str:
        return _std(value) in [standardize_string(a) for a in listed if type(a) is str]
    if expected is list:
        wanted = [[_std(answer[j]) for j in range(len(answer))] for answer in listed]
        return [_std(v) for v in value] in wanted
    return value in listed


def param_error(key: str, value: Any, listed: Sequence[Any], schema: Any) -> str | None:
    """BFCL's checks of one argument's value against its listed values; None when right.
    Raises what BFCL's code raises (`CHECKER_ERRORS`) on values it cannot read."""
    kind = bfcl_kind(schema)
    expected = PYTHON_TYPES[kind]
    nested = None
    if kind in ("array", "tuple"):
        nested = PYTHON_TYPES[bfcl_kind(schema.get("items"))]
    if kind == "float" and type(value) is int:
        value = float(value)
    typed = _type_ok(value, listed, expected, nested)
    if typed not in ("", "variable"):
        return f"Parameter {key!r}: {typed} Parameter value: {value!r}."
    if typed == "" and expected in (dict, str, list):
        if not _value_ok(value, listed, expected, nested):
            return f"Invalid value for parameter {key!r}: {value!r}. Expected one of {listed}."
        return None
    if value not in listed:
        return f"Invalid value for parameter {key!r}: {value!r}. Expected one of {listed}."
    return None


# -- one call --------------------------------------------------------------------------------


def call_error(
    spec: CallSpec, name: str, arguments: Mapping[str, Any], parameters: Mapping[str, Any] | None
) -> str | None:
    """BFCL's `simple_function_checker`: what is wrong with a call of `name` for `spec`
    (None when it matches); `parameters` is the expected function's. Raises
    `CHECKER_ERRORS` where BFCL's code raises."""
    if parameters is None:
        raise KeyError(f"no function named {spec.name!r} is offered")
    properties, required = parameters["properties"], parameters["required"]
    if name != spec.name:
        return f"Function name {spec.name!r} not found in model output."
    for key in required:
        if key not in arguments:
            return f"Missing required parameter: {key!r}."
    for key, value in arguments.items():
        if key not in properties or key not in spec.values:
            return f"Unexpected parameter: {key!r}."
        error = param_error(key, value, listed_values(spec, key), properties[key])
        if error is not None:
            return error
    for key in spec.values:
        if key not in arguments and OMIT not in listed_values(spec, key):
            return f"Optional parameter {key!r} not provided and not marked as optional."
    return None


@dataclass(frozen=True)
class CallCheck:
    """One call checked for one expected call: its error ("" when it matches), and
    whether BFCL's checker raised (which stops BFCL's run)."""

    error: str
    raised: bool = False

    @property
    def ok(self) -> bool:
        return not self.error


def check_call(
    spec: CallSpec, call: tuple[str, Mapping[str, Any]], parameters: Mapping[str, Any] | None
) -> CallCheck:
    """`call_error` of a (name, arguments) call, BFCL's exceptions caught and named."""
    try:
        error = call_error(spec, call[0], call[1], parameters)
    except CHECKER_ERRORS as err:
        return CallCheck(f"BFCL's checker raises {type(err).__name__} ({err}) here", True)
    return CallCheck(error or "")


def bfcl_verdict(
    expected: Sequence[CallSpec],
    calls: Sequence[tuple[str, Mapping[str, Any]]],
    parameters: Mapping[str, Mapping[str, Any]],
) -> Verdict:
    """BFCL's verdict on a turn's `calls` ((name, arguments) each): as many as `expected`,
    each expected call in order taking the first unused call that matches it (BFCL's
    `parallel_function_checker_no_order`, which also decides its simple and multiple
    categories' one call); `parameters` maps each offered function to its parameters."""
    if len(calls) != len(expected):
        return Verdict(False, f"Wrong number of functions: {len(calls)}, expected {len(expected)}.")
    used: set[int] = set()
    for i, spec in enumerate(expected):
        errors = []
        for j, call in enumerate(calls):
            if j in used:
                continue
            check = check_call(spec, call, parameters.get(spec.name))
            if check.ok:
                used.add(j)
                break
            if check.raised:
                return Verdict(False, check.error)
            errors.append(f"call {j}: {check.error}")
        else:
            found = "; ".join(errors)
            return Verdict(
                False, f"Could not find a matching function for expected call {i}: {found}"
            )
    return Verdict(True)


# -- the reward parts --------------------------------------------------------------------------


def _argument_check(
    spec: CallSpec, arguments: Mapping[str, Any], parameters: Mapping[str, Any], matches: bool
) -> ArgumentCheck:
    """ToolRL's figures of a call for `spec` by BFCL's per-argument rule, and `matches`."""
    properties = parameters.get("properties") or {}
    required = set(parameters.get("required") or ()) | spec.needed
    right = 0
    for key in spec.values:
        if key not in arguments:
            right += key in spec.optional
            continue
        with contextlib.suppress(*CHECKER_ERRORS):
            right += (
                param_error(key, arguments[key], listed_values(spec, key), properties.get(key))
                is None
            )
    given = set(arguments)
    union = given | required
    overlap = len(given & (set(spec.values) | required)) / len(union) if union else 1.0
    return ArgumentCheck(matches, overlap, right)


def bfcl_match(
    expected: Sequence[CallSpec],
    calls: Sequence[tuple[str, Mapping[str, Any]]],
    parameters: Mapping[str, Mapping[str, Any]],
) -> CallMatch:
    """The calls paired with `expected` for the "tool" part: BFCL's greedy order, an
    expected call nothing matches paired with the first unused call of its name."""
    pairs: list[tuple[int, int, ArgumentCheck]] = []
    used: set[int] = set()
    for i, spec in enumerate(expected):
        function = parameters.get(spec.name) or {}
        found = next(
            (j for j, c in enumerate(calls) if j not in used and check_call(spec, c, function).ok),
            None,
        )
        matches = found is not None
        if found is None:
            found = next(
                (j for j, c in enumerate(calls) if j not in used and c[0] == spec.name), None
            )
        if found is not None:
            used.add(found)
            check = _argument_check(spec, calls[found][1], function, matches)
            pairs.append((i, found, check))
    names = (frozenset(s.name for s in expected), frozenset(n for n, _ in calls))
    return CallMatch(tuple(expected), len(calls), tuple(sorted(pairs)), names)


def bfcl_parts(
    expected: Sequence[CallSpec],
    calls: Sequence[tuple[str, Mapping[str, Any]]],
    parameters: Mapping[str, Mapping[str, Any]],
    call_reward: CallReward = "seed",
) -> dict[str, float]:
    """The "correctness" (BFCL's verdict, 1 or 0) and "tool" parts of a turn's calls."""
    parts = call_parts(bfcl_match(expected, calls, parameters), call_reward)
    parts["correctness"] = float(bfcl_verdict(expected, calls, parameters).valid)
    return parts


# -- rows BFCL can score ---------------------------------------------------------------------------


def _first_right(key: str, listed: Sequence[Any], schema: Any) -> tuple[bool, Any]:
    """(found, value): the first listed value BFCL accepts for `key` given as itself."""
    for value in listed:
        candidate = _demonstrated_value(value)
        try:
            if param_error(key, candidate, listed, schema) is None:
                return True, candidate
        except CHECKER_ERRORS:
            continue
    return False, None


def _demonstrated_value(value: Any) -> Any:
    """A listed value as a call gives it: nested `{"key": [values]}` at their first value."""
    if isinstance(value, Mapping):
        return {
            k: _demonstrated_value(v[0])
            for k, v in value.items()
            if isinstance(v, list) and v and v[0] != OMIT
        }
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        return [_demonstrated_value(v) for v in value]
    return value


def bfcl_demonstration(spec: CallSpec, parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """A call of `spec` BFCL accepts: each listed argument at the first value it accepts,
    an optional one left out where none is; ValueError with BFCL's reason where none is."""
    properties = (parameters or {}).get("properties") or {}
    required = set((parameters or {}).get("required") or ())
    arguments: dict[str, Any] = {}
    for key in spec.values:
        found, value = _first_right(key, listed_values(spec, key), properties.get(key))
        if found and (value != OMIT or key in required):
            arguments[key] = value
    check = check_call(spec, (spec.name, arguments), parameters)
    if not check.ok:
        raise ValueError(check.error)
    return {"name": spec.name, "arguments": arguments}


def unscorable(
    expected: Sequence[CallSpec], parameters: Mapping[str, Mapping[str, Any]]
) -> str | None:
    """Why BFCL's checker accepts no call for a row (its reason for the first expected call
    no call can match), or None where it accepts the row's demonstration."""
    for i, spec in enumerate(expected):
        try:
            bfcl_demonstration(spec, parameters.get(spec.name))
        except ValueError as err:
            return f"expected call {i} ({spec.name}): {err}"
    return None
