"""`string_match: bfcl` (`agentgym.rewards.bfcl`): BFCL v4's checker, one hand-checked case a
rule, hypothesis properties, Tasks-v0 rows BFCL cannot score, and `agentgym/BFCL-v0`.

Each verdict below was worked out by hand from bfcl-eval's `ast_checker.py`; the
agreement with the checker itself is `tests/test_bfcl_agreement.py`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentgym  # noqa: F401  (registers the environments)
from agentgym.rewards.bfcl import (
    bfcl_demonstration,
    bfcl_parts,
    bfcl_verdict,
    standardize_string,
    unscorable,
)
from agentgym.rewards.calls import call_specs, match_calls
from agentgym.tools.schema import strict_schema

# BFCL's own type names, made strict as Tasks-v0 makes them before anything is judged
WEATHER = strict_schema(
    {
        "type": "dict",
        "properties": {
            "city": {"type": "string"},
            "radius": {"type": "float"},
            "days": {"type": "integer", "default": 1},
            "unit": {"type": "string", "default": "celsius"},
            "metric": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "filters": {"type": "dict", "properties": {"kind": {"type": "string"}}},
            "stops": {"type": "array", "items": {"type": "dict"}},
            "ids": {"type": "array", "items": {"type": "integer"}},
        },
        "required": ["city"],
    }
)
OTHER = strict_schema({"type": "dict", "properties": {"q": {"type": "string"}}, "required": []})
OFFERED = {"weather": WEATHER, "search": OTHER}


def verdict(answer: dict[str, list[Any]], arguments: dict[str, Any], name="weather") -> bool:
    """BFCL's verdict on one call of `name` against one possible answer of `weather`."""
    specs = call_specs([{"weather": answer}])
    return bfcl_verdict(specs, [(name, arguments)], OFFERED).valid


# -- strings ----------------------------------------------------------------------------------


def test_strings_are_standardized_as_bfcl_does():
    assert standardize_string("San-Francisco, CA") == "sanfranciscoca"
    assert standardize_string("It's 3*2^1 / a_b.") == 'it"s321ab'
    assert verdict({"city": ["San Francisco"]}, {"city": "SAN FRANCISCO"})
    assert verdict({"city": ["San Francisco"]}, {"city": "San-Francisco"})
    assert verdict({"city": ["San Francisco"]}, {"city": "san_francisco."})
    assert not verdict({"city": ["Los Angeles"]}, {"city": "Los Angeles!"})  # ! is kept
    assert not verdict({"city": ["Paris"]}, {"city": "Paris, France"})
    assert verdict({"city": ['"x"']}, {"city": "'X'"})  # ' read as "
    tags = {"city": ["x"], "tags": [["New York", "LA"]]}
    assert verdict(tags, {"city": "x", "tags": ["new-york", "la"]})
    assert not verdict(tags, {"city": "x", "tags": ["LA", "New York"]})  # in order


# -- types ------------------------------------------------------------------------------------


def test_type_rules_are_bfcls():
    assert verdict({"city": ["x"], "radius": [3.0]}, {"city": "x", "radius": 3})  # int for float
    assert not verdict({"city": ["x"], "days": [2]}, {"city": "x", "days": 2.0})  # not an int
    assert not verdict({"city": ["x"], "days": [1]}, {"city": "x", "days": True})
    assert not verdict({"city": ["x"], "metric": [True]}, {"city": "x", "metric": "true"})
    assert not verdict({"city": ["5"]}, {"city": 5})
    # a listed value of another type than the schema's is BFCL's "variable": that type is
    # accepted too, and then compared as written (no normalisation)
    assert verdict({"city": [5]}, {"city": 5})
    assert not verdict({"city": [5]}, {"city": "5"})
    assert verdict({"city": [None, "Oslo"]}, {"city": "Oslo"})
    assert not verdict({"city": [None, "Oslo"]}, {"city": "oslo"})
    # array items one level deep
    assert not verdict({"city": ["x"], "ids": [[1, 2]]}, {"city": "x", "ids": [1, "2"]})
    assert verdict({"city": ["x"], "ids": [[1, 2]]}, {"city": "x", "ids": [1, 2]})


# -- defaults, both ways ------------------------------------------------------------------------


def test_defaults_both_ways():
    # not listed in the answer: unexpected, even with the schema's default as its value
    assert not verdict({"city": ["x"]}, {"city": "x", "days": 1})
    assert not verdict({"city": ["x"]}, {"city": "x", "unit": "celsius"})
    # listed as optional (""): left out, or given as "", is accepted
    assert verdict({"city": ["x"], "unit": ["", "celsius"]}, {"city": "x"})
    assert verdict({"city": ["x"], "unit": ["", "celsius"]}, {"city": "x", "unit": ""})
    assert verdict({"city": ["x"], "tags": [""]}, {"city": "x", "tags": []})  # "" read as []
    assert not verdict({"city": ["x"], "unit": ["celsius"]}, {"city": "x"})  # not optional
    assert not verdict({"unit": ["celsius"]}, {"unit": "celsius"})  # required city missing
    # agentgym's own matching accepts a schema default; bfcl does not
    spec = call_specs([{"name": "weather", "arguments": {"city": "x"}}])
    assert match_calls(spec, [("weather", {"city": "x", "days": 1})], OFFERED).whole


# -- nested acceptable values, and null ---------------------------------------------------------


def test_nested_acceptable_values_for_objects_and_lists_of_objects():
    answer = {"city": ["x"], "filters": [{"kind": ["Park", "garden"]}]}
    assert verdict(answer, {"city": "x", "filters": {"kind": "GARDEN"}})
    assert not verdict(answer, {"city": "x", "filters": {"kind": "zoo"}})
    assert not verdict(answer, {"city": "x", "filters": {"kind": "park", "more": 1}})
    assert not verdict(answer, {"city": "x", "filters": {}})  # "kind" not optional
    assert verdict(
        {"city": ["x"], "filters": [{"kind": ["", "park"]}]}, {"city": "x", "filters": {}}
    )
    stops = {"city": ["x"], "stops": [[{"at": ["A"]}, {"at": ["B", "b2"]}]]}
    assert verdict(stops, {"city": "x", "stops": [{"at": "a"}, {"at": "b2"}]})
    assert not verdict(stops, {"city": "x", "stops": [{"at": "B"}, {"at": "A"}]})  # in order
    assert not verdict(stops, {"city": "x", "stops": [{"at": "A"}]})
    # an object written as it is (agentgym's own rows) is read as BFCL's nested form
    assert verdict(
        {"city": ["x"], "filters": [{"kind": "park"}]}, {"city": "x", "filters": {"kind": "Park"}}
    )
    assert not verdict({"city": ["x"], "filters": [{"kind": "park"}]}, {"city": "x", "filters": {}})


def test_null_is_an_acceptable_value_and_bfcls_exceptions_score_zero():
    assert verdict({"city": ["x"], "unit": [None]}, {"city": "x", "unit": None})
    assert not verdict({"city": ["x"], "unit": ["c", None]}, {"city": "x", "unit": None})
    # BFCL's list check reads each listed value's length: null after a list makes it raise
    specs = call_specs([{"weather": {"city": ["x"], "tags": [["b"], None]}}])
    found = bfcl_verdict(specs, [("weather", {"city": "x", "tags": ["a"]})], OFFERED)
    assert not found.valid and "raises TypeError" in found.error


# -- several calls, several functions, none -----------------------------------------------------


def test_greedy_pairing_is_kept_where_a_pairing_exists():
    """BFCL pairs each expected call, in order, with the first call that matches it: with
    overlapping acceptable values the first takes the call the second needed, so BFCL
    fails a reply that a best pairing (agentgym's `exact`) accepts."""
    expected = call_specs(
        [{"weather": {"city": ["Oslo", "Rome"]}}, {"weather": {"city": ["Oslo"]}}]
    )
    calls = [("weather", {"city": "Oslo"}), ("weather", {"city": "Rome"})]
    assert not bfcl_verdict(expected, calls, OFFERED).valid
    assert bfcl_verdict(expected, calls[::-1], OFFERED).valid
    assert match_calls(expected, calls, OFFERED).whole
    parts = bfcl_parts(expected, calls, OFFERED)
    assert parts["correctness"] == 0.0 and parts["tool"] == 0.75  # (1 + 0.5) / 2 by hand


def test_parallel_order_count_choice_and_irrelevance():
    two = call_specs([{"weather": {"city": ["Oslo"]}}, {"search": {"q": ["rain"]}}])
    calls = [("weather", {"city": "oslo"}), ("search", {"q": "Rain"})]
    assert bfcl_verdict(two, calls, OFFERED).valid
    assert bfcl_verdict(two, calls[::-1], OFFERED).valid
    assert not bfcl_verdict(two, calls[:1], OFFERED).valid
    assert not bfcl_verdict(two, [*calls, calls[0]], OFFERED).valid
    one = call_specs([{"search": {"q": ["rain"]}}])  # choosing among the offered functions
    assert not bfcl_verdict(one, [("weather", {"city": "rain"})], OFFERED).valid
    assert bfcl_verdict([], [], OFFERED).valid  # irrelevance: nothing called is right
    assert not bfcl_verdict([], [("search", {"q": "rain"})], OFFERED).valid
    assert bfcl_parts([], [], OFFERED) == {"correctness": 1.0, "tool": 1.0}


def test_unscorable_rows_and_demonstrations():
    assert unscorable(call_specs([{"weather": {"days": [""]}}]), OFFERED) == (
        "expected call 0 (weather): Missing required parameter: 'city'."
    )
    assert "Unexpected parameter: 'nope'" in unscorable(
        call_specs([{"weather": {"city": ["x"], "nope": [1]}}]), OFFERED
    )
    spec = call_specs(
        [{"weather": {"city": [None, "x"], "filters": [{"kind": ["a"]}], "unit": [""]}}]
    )
    assert bfcl_demonstration(spec[0], WEATHER) == {
        "name": "weather",
        "arguments": {"city": None, "filters": {"kind": "a"}},
    }


# -- properties ---------------------------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_standardizing_is_idempotent(text):
    once = standardize_string(text)
    assert standardize_string(once) == once


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.sampled_from(sorted(WEATHER["properties"])), JSON, max_size=5), st.randoms()
)
def test_the_verdict_does_not_depend_on_the_arguments_order(arguments, rng):
    answer = {"city": ["Oslo"], "unit": ["", "c"], "tags": [["a"], ""], "days": [1, 2]}
    specs = call_specs([{"weather": answer}])
    keys = list(arguments)
    rng.shuffle(keys)
    shuffled = {k: arguments[k] for k in keys}
    first = bfcl_verdict(specs, [("weather", arguments)], OFFERED)
    assert bfcl_verdict(specs, [("weather", shuffled)], OFFERED).valid == first.valid


@settings(max_examples=120, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(sorted(WEATHER["properties"])), st.lists(JSON, max_size=3), max_size=4
    ),
    st.lists(
        st.tuples(
            st.sampled_from(["weather", "search", "x"]),
            st.dictionaries(st.text(max_size=5), JSON, max_size=4),
        ),
        max_size=3,
    ),
)
def test_random_answers_and_calls_never_crash_the_matcher(answer, calls):
    specs = call_specs([{"weather": answer}])
    parts = bfcl_parts(specs, calls, OFFERED, "toolrl")
    assert parts["correctness"] in (0.0, 1.0) and -1.0 <= parts["tool"] <= 1.0
    reason = unscorable(specs, OFFERED)
    if reason is None:  # a row BFCL can score: its demonstration is right
        demo = bfcl_demonstration(specs[0], WEATHER)
        assert bfcl_verdict(specs, [(demo["name"], demo["arguments"])], OFFERED).valid


# -- Tasks-v0 with string_match: bfcl -----------------------------------------------------------

FUNCTION = {
    "name": "weather",
    "description": "The weather of a city.",
    "parameters": {
        "type": "dict",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}


CALL = '<tool_call>\n{"name": "weather", "arguments": %s}\n</tool_call>'


def _bfcl_file(tmp_path, rows: list[dict[str, Any]]) -> str:
    path = tmp_path / "bfcl.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_tasks_v0_skips_rows_bfcl_cannot_score_by_line_and_id(tmp_path, caplog):
    rows = [
        {
            "id": "a_0",
            "prompt": "Weather in Oslo?",
            "tools": [FUNCTION],
            "calls": [{"weather": {"city": ["Oslo"], "days": [""]}}],
        },
        {
            "id": "a_1",
            "prompt": "Rome, 2 days?",
            "tools": [FUNCTION],
            "calls": [{"weather": {"days": [2]}}],
        },
        {"id": "a_2", "prompt": "Tell me a joke.", "tools": [], "calls": []},
        {
            "id": "a_3",
            "prompt": "Paris for 3 days?",
            "tools": [FUNCTION],
            "calls": [{"weather": {"city": ["Paris"], "days": [None, 3]}}],
        },
    ]
    data = _bfcl_file(tmp_path, rows)
    options = {"tools_column": "tools", "expected_calls_column": "calls"}
    with pytest.raises(ValueError, match="the schema requires"):  # the strict matcher refuses
        gym.make("agentgym/Tasks-v0", data=data, **options)
    with caplog.at_level(logging.WARNING):
        env = gym.make("agentgym/Tasks-v0", data=data, string_match="bfcl", **options).unwrapped
    assert env.table.skipped == {
        "line 2": "a_1: expected call 0 (weather): Missing required parameter: 'city'."
    }
    assert "line 2: a_1" in caplog.text
    assert sorted(t.prompt for t in env.table.tasks.values()) == sorted(
        r["prompt"] for r in rows if r["id"] != "a_1"
    )
    scored = {}
    for task_id, task in env.table.tasks.items():
        env.reset(options={"task_id": task_id})
        reply = CALL % '{"city": "OSLO", "days": null}'
        scored[task.prompt] = env.step(reply)[4]["reward_parts"]["correctness"]
    # a_0: days is not listed with null; a_3 wants Paris; a_2: nothing is to be called
    assert scored == {"Weather in Oslo?": 0.0, "Tell me a joke.": 0.0, "Paris for 3 days?": 0.0}
    env.reset(
        options={"task_id": next(i for i, t in env.table.tasks.items() if "Paris" in t.prompt)}
    )
    reply = CALL % '{"city": "paris", "days": null}'
    assert env.step(reply)[4]["reward_parts"]["correctness"] == 1.0


def test_tasks_v0_with_bfcl_still_refuses_malformed_rows(tmp_path):
    rows = [
        {
            "id": "b_0",
            "prompt": "Oslo?",
            "tools": [FUNCTION],
            "calls": [{"weather": {"city": "Oslo"}}],
        },
        {
            "id": "b_1",
            "prompt": "Rome?",
            "tools": [FUNCTION],
            "calls": [{"weather": {"city": ["Rome"]}}],
        },
    ]
    data = _bfcl_file(tmp_path, rows)
    with pytest.raises(ValueError, match=r"line 1, column 'calls'.*argument 'city'"):
        gym.make(
            "agentgym/Tasks-v0",
            data=data,
            tools_column="tools",
            expected_calls_column="calls",
            string_match="bfcl",
        )


# -- agentgym/BFCL-v0 -----------------------------------------------------------------------------

LOADED = {
    "simple_python": 400,
    "multiple": 200,
    "parallel": 200,
    "parallel_multiple": 198,
    "irrelevance": 240,
    "live_simple": 256,
    "live_multiple": 1050,
    "live_parallel": 16,
    "live_parallel_multiple": 24,
    "live_irrelevance": 884,
}


def test_bfcl_v0_loads_every_row_bfcl_can_score_with_bfcls_ids():
    pytest.importorskip("bfcl_eval")
    from importlib.metadata import version

    env = gym.make("agentgym/BFCL-v0").unwrapped
    scoring = json.loads(json.dumps(env.scoring))
    assert scoring["rows"] == LOADED and scoring["version"] == version("bfcl-eval")
    assert scoring["string_match"] == "bfcl" and len(scoring["skipped"]) == 7
    assert "Missing required parameter: 'statement'" in env.skipped["live_multiple_964-207-0"]
    train, test = (set(env.split_ids[s]) for s in ("train", "test"))
    assert not train & test and len(train | test) == sum(LOADED.values())
    assert 0.15 < len(test) / len(train | test) < 0.25
    again = gym.make("agentgym/BFCL-v0").unwrapped
    assert again.split_ids == env.split_ids  # the hash split is deterministic
    # rows whose nested acceptable values Tasks-v0's own matching compared literally
    for task_id in ("simple_python_337", "parallel_29", "live_simple_165-98-0"):
        env.reset(options={"task_id": task_id})
        (reply,) = env.demonstration(env.task)
        assert env.step(reply)[4]["reward_parts"]["correctness"] == 1.0, task_id
    # parallel_178 lists Microsoft or Apple for its first call (2022-01-01): BFCL's greedy
    # pairing lets that call take Apple's, and fails the reply that names Apple's first
    quotes = [("Apple", "2022-01-01"), ("Microsoft", "2022-01-01")]
    quotes += [("Microsoft", "2022-02-01"), ("Apple", "2022-02-01")]
    stock = '{"name": "get_stock_price", "arguments": {"company_name": "%s", "date": "%s"}}'
    for order, right in (((0, 1, 2, 3), 0.0), ((1, 0, 2, 3), 1.0)):
        env.reset(options={"task_id": "parallel_178"})
        reply = "\n".join(f"<tool_call>\n{stock % quotes[i]}\n</tool_call>" for i in order)
        assert env.step(reply)[4]["reward_parts"]["correctness"] == right


def test_bfcl_v0_benchmark_plays_every_row_in_published_order():
    pytest.importorskip("bfcl_eval")
    env = gym.make("agentgym/BFCL-v0", categories=["simple_python", "irrelevance"], benchmark=True)
    bfcl = env.unwrapped
    assert bfcl.num_tasks("test") == 640
    assert [bfcl.task_id("test", i) for i in (0, 1, 399, 400)] == [
        "simple_python_0",
        "simple_python_1",
        "simple_python_399",
        "irrelevance_0",
    ]
    with pytest.raises(ValueError, match="benchmark=True has no train split"):
        bfcl.reset(seed=0, options={"split": "train"})
    assert bfcl.reset(seed=0)[1]["split"] == "test"  # no split named: the test split
    _, info = env.reset(options={"task_id": "simple_python_12"})
    assert info["category"] == "simple_python" and info["split"] == "test"
    assert info["tools"][0]["function"]["name"] == "geometry.circumference"
    (reply,) = bfcl.demonstration(bfcl.task)
    assert env.step(reply)[4]["reward_parts"]["correctness"] == 1.0
    env.reset(options={"task_id": "simple_python_12"})
    wrong = CALL.replace("weather", "geometry.circumference") % '{"radius": 3.5}'
    assert env.step(wrong)[4]["reward_parts"]["correctness"] == 0.0
    env.reset(options={"task_id": "irrelevance_0"})
    assert env.step("No function fits.")[4]["reward_parts"]["correctness"] == 1.0
    with pytest.raises(ValueError, match="simple_java.*java_type_converter"):
        gym.make("agentgym/BFCL-v0", categories=["simple_java"])
    with pytest.raises(KeyError, match="BFCL cannot score it"):
        gym.make("agentgym/BFCL-v0", categories=["live_multiple"]).unwrapped.load_task(
            "live_multiple_964-207-0"
        )


def test_the_function_calls_world_scores_its_demonstrations_under_bfcl():
    env = gym.make("agentgym/FunctionCalls-v0", difficulty=[3, 4, 5], string_match="bfcl")
    for index in range(12):  # parallel calls, no call, nested objects and lists
        task_id = env.unwrapped.task_id("test", index)
        env.reset(options={"task_id": task_id})
        (reply,) = env.unwrapped.demonstration(env.unwrapped.task)
        assert env.step(reply)[4]["reward_parts"]["correctness"] == 1.0, task_id


def test_the_converter_writes_bfcls_rows_row_for_row(tmp_path, capsys):
    pytest.importorskip("bfcl_eval")
    from agentgym.envs.tasks.bfcl_rows import main

    out = tmp_path / "bfcl.jsonl"
    assert main([str(out), "--categories", "live_parallel", "live_simple"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 16 + 258 and rows[0]["id"] == "live_parallel_0-0-0"
    assert set(rows[0]) == {"id", "category", "prompt", "tools", "calls"}
    printed = capsys.readouterr().out
    assert "live_simple: 258 rows, 256 scorable" in printed
    assert "live_simple_106-63-0: expected call 0 (record): Missing required" in printed
    with pytest.raises(SystemExit):
        main([str(out), "--categories", "simple_javascript"])
    assert "js_type_converter" in capsys.readouterr().err
