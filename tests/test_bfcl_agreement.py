"""`string_match: bfcl` agrees with BFCL's own checker, imported from the bfcl-eval wheel.

Rows of every supported BFCL v4 category (a fixed-seed sample) are answered by calls of
our own making: the row's demonstration, and perturbations of it, each of a kind (right
and wrong names, arguments, types, string variants, defaults, parallel orders,
irrelevance). Each answer is judged by `agentgym.rewards.bfcl.bfcl_verdict` and by
`bfcl_eval.eval_checker.ast_eval.ast_checker.ast_checker` (Language.PYTHON; the
irrelevance categories as BFCL's relevance runner does: right when nothing is called).
BFCL's checker imports every vendor SDK through `bfcl_eval.constants.model_config`,
which is stubbed here (it is read only to rename dotted function names for the vendor
APIs that forbid dots: not renamed here, as for a model that allows them).
"""

from __future__ import annotations

import copy
import random
import sys
import types
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("bfcl_eval", reason="the agreement test reads BFCL's checker: make setup")

from agentgym.envs.tasks.bfcl_rows import CATEGORIES, IRRELEVANCE, category_rows  # noqa: E402
from agentgym.rewards.bfcl import bfcl_demonstration, bfcl_kind, bfcl_verdict  # noqa: E402
from agentgym.rewards.calls import call_specs  # noqa: E402
from agentgym.tools.schema import strict_schema  # noqa: E402

ROWS_PER_CATEGORY = 40
SEED = 0
MIN_AGREEMENT = 0.99

ALLOWED: dict[str, str] = {
    "raises": "BFCL's checker raises on this answer (its run stops with the exception); "
    "string_match bfcl scores it 0",
}
"""Each kind of remaining difference, with its reason; any other difference fails."""

Call = tuple[str, dict[str, Any]]


@pytest.fixture(scope="module")
def ast_checker() -> Iterator[Callable[..., Any]]:
    """BFCL's `ast_checker`, its vendor-SDK imports stubbed for this module only."""
    saved = {k: v for k, v in sys.modules.items() if k.startswith("bfcl_eval")}

    class Config:
        underscore_to_dot = False

    class Configs(dict):
        def __getitem__(self, name: str) -> Config:
            return Config()

    stub = types.ModuleType("bfcl_eval.constants.model_config")
    stub.MODEL_CONFIG_MAPPING = Configs()  # type: ignore[attr-defined]
    sys.modules["bfcl_eval.constants.model_config"] = stub
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval import ast_checker as module

    def check(row: dict[str, Any], calls: list[Call]) -> bool | str:
        if row["category"] in IRRELEVANCE:
            return not calls
        output = [{name: copy.deepcopy(arguments)} for name, arguments in calls]
        try:
            result = module.ast_checker(
                row["tools"], output, row["calls"], Language.PYTHON, row["category"], "stub"
            )
        except Exception as err:  # BFCL's run would stop here
            return f"raises {type(err).__name__}"
        return bool(result["valid"])

    yield check
    for name in [k for k in sys.modules if k.startswith("bfcl_eval")]:
        del sys.modules[name]
    sys.modules.update(saved)


# -- perturbations: each takes (rng, row, demonstration) and gives calls or None -----------------


def _strings(text: str) -> list[str]:
    return [
        text.upper(),
        text.replace(" ", "-"),
        text.replace(" ", "_"),
        text.replace(" ", ""),
        text + ".",
        text + "!",
        text.replace("'", '"'),
        " " + text.lower(),
        text + "x",
        text.replace(",", ";"),
    ]


def _pick(rng: random.Random, demo: list[Call], test: Callable[[Any, Any], bool]) -> Any:
    """(call index, key) of an argument for which test(value, schema) holds, or None."""
    found = [(i, k) for i, (_, args) in enumerate(demo) for k, v in args.items() if test(k, v)]
    return rng.choice(found) if found else None


def _with(demo: list[Call], i: int, key: str, value: Any) -> list[Call]:
    out = copy.deepcopy(demo)
    out[i][1][key] = value
    return out


def _kinds(row: dict[str, Any]) -> dict[str, Callable[[random.Random, list[Call]], Any]]:
    """The perturbations of a row's demonstration, by kind."""
    schemas = {f["name"]: f["parameters"] for f in row["tools"]}

    def kind_of(i_call: Call, key: str) -> str:
        return bfcl_kind((schemas.get(i_call[0], {}).get("properties") or {}).get(key))

    def arg(rng: random.Random, demo: list[Call], want: Callable[[str, Any, str], bool]) -> Any:
        found = [
            (i, k)
            for i, call in enumerate(demo)
            for k, v in call[1].items()
            if want(k, v, kind_of(call, k))
        ]
        return rng.choice(found) if found else None

    def string_variant(rng, demo):
        hit = arg(rng, demo, lambda k, v, t: isinstance(v, str) and v and t in ("string", "any"))
        return hit and _with(demo, *hit, rng.choice(_strings(demo[hit[0]][1][hit[1]])))

    def list_variant(rng, demo):
        hit = arg(rng, demo, lambda k, v, t: isinstance(v, list) and len(v) >= 2)
        if not hit:
            return None
        value = list(demo[hit[0]][1][hit[1]])
        if rng.random() < 0.5 and isinstance(value[0], str):
            value[0] = rng.choice(_strings(value[0]))
        else:
            value.reverse()
        return _with(demo, *hit, value)

    def number_type(rng, demo):
        hit = arg(rng, demo, lambda k, v, t: type(v) in (int, float))
        if not hit:
            return None
        value = demo[hit[0]][1][hit[1]]
        return _with(demo, *hit, float(value) if type(value) is int else int(value))

    def wrong_type(rng, demo):
        hit = arg(rng, demo, lambda k, v, t: v is not None)
        if not hit:
            return None
        value = demo[hit[0]][1][hit[1]]
        swaps = {str: lambda v: 1, int: str, float: str, bool: int}
        return _with(demo, *hit, swaps.get(type(value), lambda v: "x")(value))

    def other_value(rng, demo):
        hit = arg(rng, demo, lambda k, v, t: type(v) in (int, float, str, bool))
        if not hit:
            return None
        value = demo[hit[0]][1][hit[1]]
        other = {bool: lambda v: not v, str: lambda v: v + " else"}.get(
            type(value), lambda v: v + 1
        )
        return _with(demo, *hit, other(value))

    def alternative_value(rng, demo):
        options = []
        for i, (_name, args) in enumerate(demo):
            answer = next(iter(row["calls"][i].values())) if i < len(row["calls"]) else {}
            for key in args:
                listed = [v for v in answer.get(key, []) if v != ""]
                if len(listed) >= 2 and not isinstance(listed[-1], dict):
                    options.append((i, key, listed[-1]))
        if not options:
            return None
        i, key, value = rng.choice(options)
        return _with(demo, i, key, value)

    def null_value(rng, demo):
        hit = arg(rng, demo, lambda k, v, t: True)
        return hit and _with(demo, *hit, None)

    def listed_null(rng, demo):
        options = []
        for i, (_name, args) in enumerate(demo):
            listed = next(iter(row["calls"][i].values())) if i < len(row["calls"]) else {}
            options += [(i, k) for k, v in listed.items() if None in v or k not in args]
        return _with(demo, *rng.choice(options), None) if options else None

    def nested_object(rng, demo):
        hit = arg(rng, demo, lambda k, v, t: isinstance(v, dict) and v)
        if not hit:
            return None
        value = copy.deepcopy(demo[hit[0]][1][hit[1]])
        key = rng.choice(sorted(value))
        if isinstance(value[key], str) and rng.random() < 0.5:
            value[key] = rng.choice(_strings(value[key]))
        else:
            del value[key]
        return _with(demo, *hit, value)

    def missing_argument(rng, demo):
        hit = arg(rng, demo, lambda k, v, t: True)
        if not hit:
            return None
        out = copy.deepcopy(demo)
        del out[hit[0]][1][hit[1]]
        return out

    def default_or_unlisted(rng, demo):
        options = []
        for i, (name, args) in enumerate(demo):
            listed = next(iter(row["calls"][i].values())) if i < len(row["calls"]) else {}
            for key, schema in (schemas.get(name, {}).get("properties") or {}).items():
                if key not in args and key not in listed:
                    options.append((i, key, schema.get("default", "x")))
        if not options:
            i = rng.randrange(len(demo))
            return _with(demo, i, "not_a_parameter", 1)
        return _with(demo, *rng.choice(options))

    def optional_given_empty(rng, demo):
        options = []
        for i, (_name, _args) in enumerate(demo):
            listed = next(iter(row["calls"][i].values())) if i < len(row["calls"]) else {}
            options += [(i, k) for k, v in listed.items() if "" in v]
        return _with(demo, *rng.choice(options), "") if options else None

    def optional_left_out(rng, demo):
        out = copy.deepcopy(demo)
        dropped = False
        for i, (_name, args) in enumerate(out):
            listed = next(iter(row["calls"][i].values())) if i < len(row["calls"]) else {}
            for key in [k for k in args if "" in listed.get(k, [])]:
                del args[key]
                dropped = True
        return out if dropped else None

    def wrong_name(rng, demo):
        out = copy.deepcopy(demo)
        i = rng.randrange(len(out))
        others = [n for n in schemas if n != out[i][0]]
        name = rng.choice(others) if others and rng.random() < 0.5 else out[i][0] + "_v2"
        out[i] = (name, out[i][1])
        return out

    def parallel_order(rng, demo):
        if len(demo) < 2:
            return None
        out = copy.deepcopy(demo)
        while out == demo:
            rng.shuffle(out)
        return out

    def parallel_count(rng, demo):
        out = copy.deepcopy(demo)
        i = rng.randrange(len(out))
        if len(out) >= 2 and rng.random() < 0.5:
            out[i] = copy.deepcopy(out[(i + 1) % len(out)])  # one call twice, one missing
        elif rng.random() < 0.5:
            out.pop(i)
        else:
            out.append(copy.deepcopy(out[i]))
        return out

    def irrelevance(rng, demo):
        if row["category"] not in IRRELEVANCE:
            return []  # no call where calls are expected
        if not row["tools"]:
            return None
        function = rng.choice(row["tools"])
        required = function["parameters"].get("required", [])
        return [(function["name"], {k: "x" for k in required})]

    kinds: dict[str, Callable[[random.Random, list[Call]], Any]] = {
        "right": lambda rng, demo: copy.deepcopy(demo),
        "wrong_name": wrong_name,
        "missing_argument": missing_argument,
        "unlisted_or_default_argument": default_or_unlisted,
        "optional_given_empty": optional_given_empty,
        "optional_left_out": optional_left_out,
        "string_variant": string_variant,
        "list_variant": list_variant,
        "int_float": number_type,
        "wrong_type": wrong_type,
        "other_value": other_value,
        "alternative_value": alternative_value,
        "null_value": null_value,
        "listed_null_or_left_out_as_null": listed_null,
        "nested_object": nested_object,
        "parallel_order": parallel_order,
        "parallel_count": parallel_count,
        "irrelevance": irrelevance,
    }
    return kinds


def _nested_or_null(row: dict[str, Any]) -> bool:
    """Whether a row's answer lists an object, a list of objects, or null."""
    listed = [
        v for call in row["calls"] for args in call.values() for vs in args.values() for v in vs
    ]
    return any(
        v is None or isinstance(v, dict) or (isinstance(v, list) and v and isinstance(v[0], dict))
        for v in listed
    )


def _sample() -> list[dict[str, Any]]:
    """ROWS_PER_CATEGORY rows of each category, and as many more whose answers list objects
    or null (BFCL's nested forms), all drawn with SEED."""
    rng = random.Random(SEED)
    rows, rest = [], []
    for category in CATEGORIES:
        found = category_rows(category)
        chosen = set(rng.sample(range(len(found)), min(ROWS_PER_CATEGORY, len(found))))
        rows += [found[i] for i in sorted(chosen)]
        rest += [r for i, r in enumerate(found) if i not in chosen and _nested_or_null(r)]
    return rows + rng.sample(rest, min(len(rest), ROWS_PER_CATEGORY * 2))


def _demonstration(row: dict[str, Any]) -> tuple[list[Call], Any, dict[str, Any]]:
    specs = call_specs(row["calls"])
    parameters = {f["name"]: strict_schema(f["parameters"]) for f in row["tools"]}
    demo = []
    for spec in specs:
        try:
            call = bfcl_demonstration(spec, parameters.get(spec.name))
        except ValueError:  # BFCL cannot score the row: its first listed values
            call = {"name": spec.name, "arguments": {k: v[0] for k, v in spec.values.items() if v}}
        demo.append((call["name"], call["arguments"]))
    return demo, specs, parameters


def test_bfcl_verdicts_agree_with_bfcls_own_checker(ast_checker):
    rng = random.Random(SEED)
    tally: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # agree, judged, valid
    differences: list[tuple[str, str, str, Any, Any]] = []
    for row in _sample():
        demo, specs, parameters = _demonstration(row)
        for kind, make in _kinds(row).items():
            if not demo and kind not in ("right", "irrelevance"):
                continue  # an irrelevance row: no call, or a call
            calls = make(rng, demo)
            if calls is None:
                continue
            mine = bfcl_verdict(specs, calls, parameters).valid
            theirs = ast_checker(row, calls)
            figures = tally[kind]
            figures[1] += 1
            figures[2] += mine
            if mine == theirs:
                figures[0] += 1
            else:
                reason = "raises" if isinstance(theirs, str) else "verdict"
                differences.append((reason, kind, row["id"], calls, theirs))
    agree = sum(f[0] for f in tally.values())
    judged = sum(f[1] for f in tally.values())
    print(f"\nBFCL agreement: {agree}/{judged} ({agree / judged:.2%})")
    for kind, (same, total, valid) in sorted(tally.items()):
        print(f"  {kind:30s} {same:5d}/{total:<5d} equal ({same / total:.1%}); {valid} valid")
    for reason, kind, ident, calls, theirs in differences:
        why = ALLOWED.get(reason, "NOT ALLOWED")
        print(f"  differs ({reason}: {why}): {kind} {ident} {calls} BFCL={theirs}")
    assert len(tally) >= 10 and all(total >= 20 for _, total, _ in tally.values()), dict(tally)
    assert agree / judged >= MIN_AGREEMENT
    assert all(10 <= tally[k][2] < tally[k][1] for k in ("string_variant", "int_float")), dict(
        tally
    )
    assert [d for d in differences if d[0] not in ALLOWED] == []
