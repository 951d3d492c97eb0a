"""The procedural function-calling world: its table, its rows, their shapes and their splits."""

from __future__ import annotations

import functools
import json
import re
import string
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from agentgym.envs.function_calls.vocabulary import NEAR_FAMILIES
from agentgym.envs.function_calls.world import (
    APIS,
    LEVELS,
    ROWS,
    Row,
    apis,
    demonstration,
    near,
    num_rows,
    row,
    tool_schema,
)

SEED = 0
PER_LEVEL = 300  # rows checked per split and level
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
STRICT_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
CATEGORIES = {1: {"simple"}, 2: {"multiple"}, 3: {"parallel"}, 4: {"irrelevance", "multiple"}}
CATEGORIES[5] = {"nested"}


@functools.cache
def rows(split: str, level: int) -> list[Row]:
    return [row(SEED, split, level, i) for i in range(PER_LEVEL)]


def all_rows() -> Iterator[Row]:
    for split in ("train", "test"):
        for level in range(1, LEVELS + 1):
            yield from rows(split, level)


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A loose schema in JSON Schema's names: dict, float, tuple mapped, "any" dropped."""
    out = {k: v for k, v in schema.items() if not (k == "type" and v == "any")}
    if "type" in out:
        out["type"] = STRICT_TYPES.get(out["type"], out["type"])
    if "properties" in out:
        out["properties"] = {k: strict(v) for k, v in out["properties"].items()}
    if "items" in out:
        out["items"] = strict(out["items"])
    return out


def offered(r: Row) -> dict[str, dict[str, Any]]:
    """Each offered function's (name, description, strict parameters), by name."""
    found = {}
    for tool in r["tools"]:
        fn = tool.get("function", tool)
        found[fn["name"]] = {**fn, "parameters": strict(fn["parameters"])}
    return found


def values(value: Any) -> Iterator[Any]:
    """`value` and every value inside it (list items, object values), depth first."""
    yield value
    if isinstance(value, dict | list):
        for child in value.values() if isinstance(value, dict) else value:
            yield from values(child)


def assert_shape(r: Row) -> None:
    """The keys and types every row has, whatever its level."""
    assert set(r) == {"prompt", "tools", "expected_calls", "category", "level", "api"}
    assert isinstance(r["prompt"], str) and r["prompt"]
    assert r["category"] in CATEGORIES[r["level"]]
    assert 1 <= len(r["tools"]) <= 4
    names = offered(r)
    assert len(names) == len(r["tools"]), "a function offered twice"
    for call in r["expected_calls"]:
        assert len(call) == 1
        [(name, arguments)] = call.items()
        assert name in names, f"{name} called but not offered"
        assert all(isinstance(v, list) and v for v in arguments.values())


# -- the table ---------------------------------------------------------------------------------


def test_the_table_has_forty_families_of_two_to_four_functions() -> None:
    assert len(APIS) >= 40
    assert len({f.name for f in APIS}) == len(APIS)
    for family in APIS:
        assert 2 <= len(family.functions) <= 4, family.name
        kinds = {f.nested for f in family.functions}
        assert kinds == {False, True}, f"{family.name}: needs a flat and a nested function"


@pytest.mark.parametrize("family", APIS, ids=lambda f: f.name)
def test_templates_name_exactly_the_required_parameters(family: Any) -> None:
    for f in family.functions:
        required = {p.name for p in f.params if p.required}
        assert len(set(f.templates)) >= 3, f.name
        for template in f.templates:
            slots = {name for _, name, _, _ in string.Formatter().parse(template) if name}
            assert slots == required, f"{f.name}: {template!r}"
            assert template[-1] in ".?!", f"{f.name}: {template!r} needs final punctuation"


@pytest.mark.parametrize("family", APIS, ids=lambda f: f.name)
def test_parameters_are_described_and_defaults_fit_them(family: Any) -> None:
    for f in family.functions:
        assert f.description
        for p in f.params:
            assert p.description, f"{f.name}.{p.name}"
            assert not (p.kind.nested and not p.required), f"{f.name}.{p.name}: optional list"
            if not p.required:
                assert Draft202012Validator(dict(p.kind.schema)).is_valid(p.default), p.name
                slot = "{}" in p.say
                assert slot == (p.kind.schema.get("type") != "boolean"), f"{f.name}.{p.name}"


def test_names_match_the_function_name_pattern_and_some_have_dots() -> None:
    names = list(apis(SEED).functions)
    assert all(NAME.match(n) for n in names)
    assert any("." in n for n in names) and any("." not in n for n in names)
    assert len(names) == sum(len(f.functions) for f in APIS)


# -- determinism and splits -------------------------------------------------------------------


def test_the_same_arguments_give_the_same_row() -> None:
    for level in range(1, LEVELS + 1):
        for index in (0, 7, 499):
            assert row(3, "test", level, index) == row(3, "test", level, index)
    assert len({json.dumps(row(3, "train", 2, i)) for i in range(20)}) > 15


def test_another_seed_gives_another_world() -> None:
    assert apis(0).splits != apis(1).splits
    assert [row(0, "train", 1, i) for i in range(10)] != [row(1, "train", 1, i) for i in range(10)]


def test_a_quarter_of_families_are_test_families() -> None:
    splits = Counter(apis(SEED).splits.values())
    assert splits["test"] == round(len(APIS) / 4)
    assert splits["train"] == len(APIS) - splits["test"]


def test_train_and_test_rows_use_disjoint_families() -> None:
    world, seen = apis(SEED), {"train": set(), "test": set()}
    for split in seen:
        for level in range(1, LEVELS + 1):
            for r in rows(split, level):
                families = {world.functions[name].family for name in offered(r)}
                assert {world.splits[f] for f in families} == {split}
                assert world.splits[r["api"]] == split
                seen[split] |= families
    assert not seen["train"] & seen["test"]
    assert len(seen["test"]) >= 8


# -- every row ---------------------------------------------------------------------------------


def test_every_offered_schema_is_valid_json_schema() -> None:
    checked = set()
    for r in all_rows():
        for name, fn in offered(r).items():
            key = json.dumps(fn, sort_keys=True)
            if key in checked:
                continue
            checked.add(key)
            assert fn["description"] and NAME.match(name)
            Draft202012Validator.check_schema(fn["parameters"])
            assert fn["parameters"]["type"] == "object"
            for p in fn["parameters"]["properties"].values():
                assert p.get("description"), name
    assert len(checked) > 100


def test_every_expected_call_fits_its_schema() -> None:
    for r in all_rows():
        functions = offered(r)
        for call in r["expected_calls"]:
            [(name, arguments)] = call.items()
            parameters = functions[name]["parameters"]
            properties = parameters["properties"]
            assert set(parameters["required"]) <= set(arguments), name
            for arg, acceptable in arguments.items():
                assert arg in properties, f"{name}: no parameter {arg}"
                if "" in acceptable:
                    assert arg not in parameters["required"] and acceptable[-1] == ""
                    assert acceptable[0] == properties[arg]["default"]
                elif arg not in parameters["required"]:  # mentioned: never as its default
                    assert acceptable != [properties[arg]["default"]], (name, arg)
                validator = Draft202012Validator(properties[arg])
                for value in acceptable:
                    assert value == "" or validator.is_valid(value), (name, arg, value)


def test_the_query_says_every_expected_string_literally() -> None:
    said = 0
    for r in all_rows():
        for call in r["expected_calls"]:
            for acceptable in next(iter(call.values())).values():
                if "" in acceptable:
                    continue
                for value in values(acceptable[0]):
                    if isinstance(value, str):
                        assert value in r["prompt"], (value, r["prompt"])
                        said += 1
    assert said > 3000


def test_a_quarter_of_rows_write_loose_schemas() -> None:
    loose = [all("function" not in t for t in r["tools"]) for r in all_rows()]
    strict_form = [all(t.get("type") == "function" for t in r["tools"]) for r in all_rows()]
    assert all(a != b for a, b in zip(loose, strict_form, strict=True)), "forms mixed in a row"
    assert 0.18 < sum(loose) / len(loose) < 0.32
    types = {
        p["type"]
        for r in all_rows()
        if "function" not in r["tools"][0]
        for t in r["tools"]
        for p in [t["parameters"], *t["parameters"]["properties"].values()]
    }
    assert {"dict", "float", "tuple"} <= types
    assert not {"object", "number", "array"} & types


def test_loose_schemas_write_any_for_unconstrained_values() -> None:
    world = apis(SEED)
    loose = [tool_schema(f, loose=True)["parameters"] for f in world.functions.values()]
    types = {p["type"] for schema in loose for p in schema["properties"].values()}
    assert "any" in types
    for schema in loose:
        Draft202012Validator.check_schema(strict(schema))


# -- each level's shape ----------------------------------------------------------------------


def nested_arguments(r: Row) -> list[Any]:
    return [
        acceptable[0]
        for call in r["expected_calls"]
        for acceptable in next(iter(call.values())).values()
        if isinstance(acceptable[0], list | dict)
    ]


@pytest.mark.parametrize("split", ["train", "test"])
def test_levels_have_their_shapes(split: str) -> None:
    for level in range(1, LEVELS + 1):
        for r in rows(split, level):
            assert_shape(r)
            assert r["level"] == level
            calls, tools = len(r["expected_calls"]), len(r["tools"])
            shape = (r["category"], tools, calls)
            if level == 1:
                assert shape == ("simple", 1, 1)
            elif level in (2, 4) and r["category"] == "multiple":
                assert (tools, calls) == (4, 1)
            elif level == 3:
                assert r["category"] == "parallel" and 2 <= calls <= 3 and 2 <= tools <= 4
            elif level == 4:
                assert shape == ("irrelevance", 4, 0)
            else:
                assert r["category"] == "nested" and calls == 1 and tools in (3, 4)
            assert bool(nested_arguments(r)) == (level == 5), r


def test_parallel_rows_mix_one_function_repeated_and_several() -> None:
    kinds = Counter()
    for r in rows("train", 3):
        names = [next(iter(c)) for c in r["expected_calls"]]
        kinds["repeated" if len(set(names)) == 1 else "several"] += 1
        if len(set(names)) == 1:
            arguments = [json.dumps(c, sort_keys=True) for c in r["expected_calls"]]
            assert len(set(arguments)) == len(arguments), "the same call twice"
    assert kinds["repeated"] > 100 and kinds["several"] > 100
    assert {len(r["expected_calls"]) for r in rows("train", 3)} == {2, 3}


def test_a_third_of_level_4_is_irrelevance_and_no_offered_family_fits() -> None:
    world = apis(SEED)
    irrelevant = [r for r in rows("train", 4) if r["category"] == "irrelevance"]
    assert 0.25 < len(irrelevant) / PER_LEVEL < 0.42
    for r in irrelevant:
        assert r["expected_calls"] == []
        families = {world.functions[n].family for n in offered(r)}
        assert not families & near(r["api"]), (r["api"], families)
    near_asked = [r for r in irrelevant if len(near(r["api"])) > 1]
    assert near_asked, "no irrelevance row asks a family with near ones"


def test_near_families_are_families() -> None:
    assert set().union(*NEAR_FAMILIES) <= {f.name for f in APIS}
    assert near("calendar") == {"calendar", "clinic"} and near("units") == {"units"}


def test_level_5_has_lists_and_objects() -> None:
    found = [type(v) for r in rows("train", 5) for v in nested_arguments(r)]
    assert list in found and dict in found


# -- the API ---------------------------------------------------------------------------------


def test_demonstration_takes_each_first_value_and_leaves_out_blanks() -> None:
    r = row(SEED, "train", 1, 0)
    r["expected_calls"] = [{"f": {"a": [1, 2], "b": ["", "x"], "c": ["kg", ""]}}]
    assert demonstration(r) == [{"name": "f", "arguments": {"a": 1, "c": "kg"}}]
    irrelevant = next(r for r in rows("train", 4) if r["category"] == "irrelevance")
    assert demonstration(irrelevant) == []
    parallel = rows("test", 3)[0]
    assert [d["name"] for d in demonstration(parallel)] == [
        next(iter(c)) for c in parallel["expected_calls"]
    ]


def test_rows_share_no_mutable_state() -> None:
    r = row(SEED, "test", 5, 1)
    kept = json.dumps(r, sort_keys=True)
    for tool in r["tools"]:
        (tool.get("function") or tool)["parameters"]["properties"].clear()
    for call in r["expected_calls"]:
        next(iter(call.values())).clear()
    assert json.dumps(row(SEED, "test", 5, 1), sort_keys=True) == kept


def test_num_rows() -> None:
    assert num_rows("train", 1) == ROWS["train"] == 5000
    assert num_rows("test", 5) == ROWS["test"] == 500


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ((0, "dev", 1, 0), r"split='dev'; valid: 'train' or 'test'"),
        ((0, "train", 0, 0), r"difficulty=0; valid: an int from 1 to 5"),
        ((0, "train", 6, 0), r"difficulty=6"),
        ((0, "train", 1, 5000), r"index=5000; valid: an int from 0 to 4999"),
        ((0, "test", 1, 500), r"index=500; valid: an int from 0 to 499"),
        ((0, "test", 1, -1), r"index=-1"),
        ((0, "test", True, 0), r"difficulty=True"),
        (("0", "test", 1, 0), r"seed='0'; valid: an int"),
    ],
)
def test_bad_arguments_are_named_with_their_range(args: tuple[Any, ...], named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        row(*args)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    level=st.integers(1, LEVELS),
    split=st.sampled_from(["train", "test"]),
    data=st.data(),
)
def test_any_row_has_the_shape(seed: int, level: int, split: str, data: st.DataObject) -> None:
    index = data.draw(st.integers(0, num_rows(split, level) - 1))
    r = row(seed, split, level, index)
    assert_shape(r)
    assert r["level"] == level
    assert len(demonstration(r)) == len(r["expected_calls"])
