"""The matching rules and rewards of `agentgym.rewards.calls`, one hand-written example a rule.

Every figure is computed by hand in the comment beside it. A hypothesis test sends
arbitrary JSON through the reader and the matcher: models under reward pressure write
everything, and the matcher must never raise.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym.rewards.calls import (
    CallSpec,
    call_parts,
    call_specs,
    match_calls,
    normalize_string,
    spec_problems,
    value_matches,
)
from agentgym.tools.schema import strict_schema

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "default": 1},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
    },
    "required": ["city"],
}
ROUTE = {
    "type": "object",
    "properties": {
        "stops": {"type": "array", "items": {"type": "string"}},
        "options": {
            "type": "object",
            "properties": {"avoid_tolls": {"type": "boolean"}, "speed": {"type": "number"}},
        },
    },
    "required": ["stops"],
}
PARAMS = {"get_weather": WEATHER, "route": ROUTE, "pay": {"type": "object", "properties": {}}}


def spec(name: str, **values: object) -> CallSpec:
    """An exact expected call."""
    return call_specs([{"name": name, "arguments": values}])[0]


def judge(expected, calls, string_match="exact", reward="seed") -> dict[str, float]:
    match = match_calls(expected, calls, PARAMS, string_match)
    return call_parts(match, reward)


# -- reading the two forms ----------------------------------------------------------------------


def test_both_forms_and_openai_wrapping_read_as_the_same_specs():
    exact = call_specs([{"name": "get_weather", "arguments": '{"city": "Oslo"}'}])
    wrapped = call_specs(
        [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]
    )
    acceptable = call_specs([{"get_weather": {"city": ["Oslo"]}}])
    assert exact == wrapped == acceptable == (CallSpec("get_weather", {"city": ("Oslo",)}),)


def test_empty_string_in_an_acceptable_list_marks_the_argument_optional():
    (got,) = call_specs([{"get_weather": {"city": ["Oslo", "oslo"], "unit": ["celsius", ""]}}])
    assert got.values == {"city": ("Oslo", "oslo"), "unit": ("celsius",)}
    assert got.optional == {"unit"} and got.needed == {"city"}
    # the exact form has no "may be left out": "" there is a value
    (exact,) = call_specs([{"name": "pay", "arguments": {"memo": ""}}])
    assert exact.values == {"memo": ("",)} and exact.optional == frozenset()


@pytest.mark.parametrize(
    "item, words",
    [
        ("get_weather", "call 0 is"),
        ({"get_weather": {"city": "Oslo"}}, "argument 'city'"),
        ({"a": {}, "b": {}}, "has keys"),
        ({"name": "f", "arguments": [1]}, "has arguments"),
    ],
)
def test_a_malformed_expected_call_is_a_value_error_saying_which(item, words):
    with pytest.raises(ValueError, match=words):
        call_specs([item])


def test_spec_problems_name_unknown_missing_and_mistyped_arguments():
    problems = spec_problems(CallSpec("get_weather", {"town": ("Oslo",), "days": ("3",)}), WEATHER)
    text = "; ".join(problems)
    assert "'town' is not among the function's parameters" in text
    assert "requires ['city']" in text
    assert '\'days\' lists "3", not a value of its type "integer"' in text
    assert spec_problems(spec("get_weather", city="Oslo", days=3), WEATHER) == []


# -- rule 1: names exactly ----------------------------------------------------------------------


def test_names_match_exactly_case_counts():
    assert judge([spec("get_weather", city="Oslo")], [("Get_Weather", {"city": "Oslo"})]) == {
        "correctness": 0.0,
        "tool": -0.5,  # no call paired (0), one extra (-0.5), over 1 expected call
    }


# -- rule 2: which arguments ---------------------------------------------------------------------


def test_a_needed_argument_missing_or_an_unknown_one_fails_the_arguments():
    want = [spec("get_weather", city="Oslo", days=3)]
    assert judge(want, [("get_weather", {"city": "Oslo"})])["tool"] == 0.5  # name only
    extra = {"city": "Oslo", "days": 3, "country": "NO"}
    assert judge(want, [("get_weather", extra)])["tool"] == 0.5
    assert judge(want, [("get_weather", {"city": "Oslo", "days": 3})])["tool"] == 1.0


def test_an_unlisted_argument_is_right_only_with_the_schemas_default():
    want = [spec("get_weather", city="Oslo")]
    with_default = {"city": "Oslo", "unit": "celsius"}
    assert judge(want, [("get_weather", with_default)])["correctness"] == 1.0
    other = {"city": "Oslo", "unit": "fahrenheit"}
    assert judge(want, [("get_weather", other)])["correctness"] == 0.0


def test_the_schemas_required_arguments_are_required_even_if_the_spec_lists_them_optional():
    optional_city = call_specs([{"get_weather": {"city": ["Oslo", ""]}}])
    assert judge(list(optional_city), [("get_weather", {})])["correctness"] == 0.0


def test_an_optional_argument_may_be_left_out_or_given_a_listed_value():
    want = list(call_specs([{"get_weather": {"city": ["Oslo"], "days": [3, ""]}}]))
    assert judge(want, [("get_weather", {"city": "Oslo"})])["correctness"] == 1.0
    assert judge(want, [("get_weather", {"city": "Oslo", "days": 3})])["correctness"] == 1.0
    assert judge(want, [("get_weather", {"city": "Oslo", "days": 4})])["correctness"] == 0.0


# -- rule 3: values under the schema's type --------------------------------------------------------


@pytest.mark.parametrize(
    "expected, actual, schema, ok",
    [
        (2.5, 2.5, {"type": "number"}, True),
        (3.0, 3, {"type": "number"}, True),  # an integer where a number is asked
        (3, 3.0, {"type": "number"}, True),  # equal as numbers
        (12, "12", {"type": "number"}, False),  # a string is not a number
        (1, True, {"type": "number"}, False),  # nor is a bool
        (2, 2, {"type": "integer"}, True),
        (2, 2.0, {"type": "integer"}, False),  # an integer is written as one
        (1, True, {"type": "integer"}, False),
        (True, True, {"type": "boolean"}, True),
        (True, 1, {"type": "boolean"}, False),
        ("Oslo", "Oslo", {"type": "string"}, True),
        ("Oslo", "oslo", {"type": "string"}, False),  # exact: case counts
        (None, None, {"type": "null"}, True),
        (["a", "b"], ["a", "b"], {"type": "array", "items": {"type": "string"}}, True),
        (["a", "b"], ["b", "a"], {"type": "array"}, False),  # element by element, in order
        (["a", "b"], ["a"], {"type": "array"}, False),
        ([1, 2], [1.0, 2], {"type": "array", "items": {"type": "number"}}, True),
        ({"x": 1}, {"x": 1.0}, {"type": "object", "properties": {"x": {"type": "number"}}}, True),
        ({"x": 1}, {"x": 1, "y": 2}, {"type": "object"}, False),  # the same keys
        ({"x": 1}, {"x": 1.0}, {}, True),  # no type: the expected value's JSON type (number)
        ("a", "a", {"type": ["string", "null"]}, True),
        (None, None, {"type": ["string", "null"]}, True),
    ],
)
def test_value_matches_by_the_schema_type(expected, actual, schema, ok):
    assert value_matches(expected, actual, schema, "exact") is ok


def test_normalized_strings_fold_case_whitespace_and_the_stated_punctuation_only():
    assert normalize_string("  New   York. ") == "new york"
    assert normalize_string('It\'s "fine"!') == "its fine"
    assert value_matches("new york", "  New York.", {"type": "string"}, "normalized")
    assert not value_matches("new york", "  New York.", {"type": "string"}, "exact")
    # '-' and '/' are not in the list: dates written differently stay different
    assert not value_matches("2025-03-14", "2025/03/14", {"type": "string"}, "normalized")
    # nested strings follow the same setting
    nested = {"type": "array", "items": {"type": "string"}}
    assert value_matches(["Lyon"], ["LYON "], nested, "normalized")


# -- parallel calls, extra calls, the rewards ---------------------------------------------


def test_parallel_calls_match_order_free_each_expected_call_at_most_once():
    want = [spec("get_weather", city="Oslo"), spec("get_weather", city="Rome")]
    swapped = [("get_weather", {"city": "Rome"}), ("get_weather", {"city": "Oslo"})]
    assert judge(want, swapped) == {"correctness": 1.0, "tool": 1.0}
    twice = [("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Oslo"})]
    # Oslo pairs with Oslo (1.0); the second Oslo pairs with Rome, name only (0.5): 1.5 / 2
    assert judge(want, twice) == {"correctness": 0.0, "tool": 0.75}


def test_extra_calls_count_against_and_the_seed_part_floors_at_minus_one():
    want = [spec("get_weather", city="Oslo"), spec("route", stops=["Lyon"])]
    calls = [
        ("get_weather", {"city": "Oslo"}),  # 1.0
        ("route", {"stops": ["Dijon"]}),  # 0.5: the name
        ("pay", {}),  # extra: -0.5
    ]
    assert judge(want, calls) == {"correctness": 0.0, "tool": 0.5}  # (1.0 + 0.5 - 0.5) / 2
    spam = [("pay", {})] * 5
    assert judge(want[:1], spam)["tool"] == -1.0  # (0 - 2.5) / 1, floored


def test_no_call_scores_minus_one_when_calls_are_expected():
    assert judge([spec("get_weather", city="Oslo")], []) == {"correctness": 0.0, "tool": -1.0}


def test_when_the_right_answer_is_no_call_any_call_scores_zero():
    assert judge([], []) == {"correctness": 1.0, "tool": 1.0}
    assert judge([], [("get_weather", {"city": "Oslo"})]) == {"correctness": 0.0, "tool": 0.0}
    assert judge([], [], reward="toolrl") == {"correctness": 1.0, "tool": 1.0}
    assert judge([], [("pay", {})], reward="toolrl") == {"correctness": 0.0, "tool": 0.0}


def test_toolrl_part_by_hand():
    want = [spec("get_weather", city="Oslo", days=3)]
    # names 1/1; argument names {city, days} vs {city, days}: 1; values right: city only, 1
    # over 1 + 1 call + 2 arguments = 4: (1 + 1 + 1) / 4
    got = judge(want, [("get_weather", {"city": "Oslo", "days": 4})], reward="toolrl")
    assert got == {"correctness": 0.0, "tool": 0.75}
    # an unknown argument: names 1; argument names |{city} & listed| / |{city, x} | {city, days}|
    # = 1/3; values right: city (1); (1 + 1/3 + 1) / 4
    got = judge(want, [("get_weather", {"city": "Oslo", "x": 1})], reward="toolrl")
    assert got["tool"] == pytest.approx((1 + 1 / 3 + 1) / 4)
    # a wrong function besides: names {get_weather} vs {get_weather, pay}: 1/2; the pair
    # perfect (1 + 2); (0.5 + 3) / 4
    calls = [("get_weather", {"city": "Oslo", "days": 3}), ("pay", {})]
    assert judge(want, calls, reward="toolrl")["tool"] == pytest.approx(3.5 / 4)
    assert judge(want, [], reward="toolrl")["tool"] == 0.0


def test_loose_type_names_are_made_strict_at_every_depth():
    loose = {
        "type": "dict",
        "properties": {
            "a": {"type": "float"},
            "b": {"type": "tuple", "items": {"type": "int"}},
            "c": {"type": "any", "description": "anything"},
            "d": {"type": "dict", "properties": {"e": {"type": "bool"}}},
            "f": {"type": ["str", "any"]},
        },
    }
    assert strict_schema(loose) == {
        "type": "object",
        "properties": {
            "a": {"type": "number"},
            "b": {"type": "array", "items": {"type": "integer"}},
            "c": {"description": "anything"},
            "d": {"type": "object", "properties": {"e": {"type": "boolean"}}},
            "f": {},
        },
    }


# -- whatever a model writes ------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
NAMES = st.sampled_from(["get_weather", "route", "pay", "Get_Weather", ""]) | st.text(max_size=6)


@settings(max_examples=300, deadline=None)
@given(
    calls=st.lists(
        st.tuples(NAMES, st.dictionaries(st.text(max_size=6), JSON, max_size=4)), max_size=6
    ),
    string_match=st.sampled_from(["exact", "normalized"]),
    reward=st.sampled_from(["seed", "toolrl"]),
)
def test_any_calls_go_through_the_matcher_without_raising(calls, string_match, reward):
    want = [
        spec("get_weather", city="Oslo"),
        *call_specs([{"route": {"stops": [["Lyon"]], "options": [{"avoid_tolls": True}, ""]}}]),
    ]
    parts = judge(want, calls, string_match, reward)
    assert parts["correctness"] in (0.0, 1.0)
    assert (-1.0 if reward == "seed" else 0.0) <= parts["tool"] <= 1.0


@settings(max_examples=300, deadline=None)
@given(items=st.lists(JSON, max_size=4))
def test_any_expected_calls_cell_reads_or_raises_a_value_error(items):
    try:
        specs = call_specs(items)
    except ValueError as err:
        assert "valid" in str(err) or "call" in str(err)
        return
    json.dumps([s.demonstration() for s in specs], default=str)
