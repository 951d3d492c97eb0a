"""Tools given by a JSON schema and a callable (sync or async), and the ToolBox's tool protocol.

Expected texts are written out by hand: they are what the model reads.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from agentgym.tools import (
    HERMES,
    CallAttempt,
    CallOutcome,
    SchemaTool,
    ToolBox,
    ToolErrorKind,
    ToolResult,
    schema_tool,
    tool,
)
from agentgym.types import ToolCall

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Adds two integers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "description": "The first."},
                "b": {"type": "integer", "default": 1},
            },
            "required": ["a"],
            "additionalProperties": False,
        },
    },
}
SEARCH = {  # the bare form, with a nested object, an enum and an array
    "name": "search",
    "description": "Searches.",
    "parameters": {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "mode": {"enum": ["web", "news"]},
            "ids": {"type": "array", "items": {"type": "integer"}},
            "opts": {
                "type": "object",
                "properties": {"depth": {"type": "integer"}},
                "additionalProperties": False,
            },
        },
        "required": ["query"],
    },
}


def add_sync(a, b=1):
    return a + b


async def add_async(a, b=1):
    await asyncio.sleep(0)
    return a + b


def search(**kwargs):
    return kwargs


def call(name: str, **arguments: object) -> CallAttempt:
    return CallAttempt(ToolCall(name, arguments), None)


def run_one(box: ToolBox, attempt: CallAttempt) -> ToolResult:
    [result] = box.run([attempt])
    return result


@pytest.mark.parametrize("fn", [add_sync, add_async], ids=["sync", "async"])
def test_a_schema_tool_runs_sync_and_async_callables(fn):
    box = ToolBox([schema_tool(ADD, fn)])
    assert box.run([call("add", a=2, b=3), call("add", a=2)]) == [
        ToolResult("add", "5", None),
        ToolResult("add", "3", None),
    ]


def test_calls_parsed_from_text_run_and_containers_come_back_as_json():
    box = ToolBox([schema_tool(SEARCH, search)])
    text = '<tool_call>{"name": "search", "arguments": {"query": "é", "ids": [1]}}</tool_call>'
    assert box.run(HERMES.parse(text).calls) == [
        ToolResult("search", '{"query": "é", "ids": [1]}', None)
    ]


BAD_CALLS = {
    "wrong type": (
        call("add", a="x"),
        "Error: invalid arguments for 'add': argument 'a': 'x' is not of type 'integer'. "
        "Expected add(a: integer, b: integer = 1)",
    ),
    "float for an integer": (
        call("add", a=2.0),
        "Error: invalid arguments for 'add': argument 'a': 2.0 is not of type 'integer'. "
        "Expected add(a: integer, b: integer = 1)",
    ),
    "bool for an integer": (
        call("add", a=True),
        "Error: invalid arguments for 'add': argument 'a': True is not of type 'integer'. "
        "Expected add(a: integer, b: integer = 1)",
    ),
    "extra keys": (
        call("add", a=1, c=2, d=3),
        "Error: invalid arguments for 'add': unexpected argument 'c'; unexpected argument 'd'. "
        "Expected add(a: integer, b: integer = 1)",
    ),
    "missing required": (
        call("add", b=2),
        "Error: invalid arguments for 'add': missing required argument 'a'. "
        "Expected add(a: integer, b: integer = 1)",
    ),
    "nested fields": (
        call("search", query="q", opts={"depth": "1", "x": 0}, ids=[1, "2"]),
        "Error: invalid arguments for 'search': argument 'ids[1]': '2' is not of type 'integer'; "
        "argument 'opts.depth': '1' is not of type 'integer'; unexpected argument 'opts.x'. "
        'Expected search(query: string, mode?: "web" | "news", ids?: array[integer], '
        "opts?: object)",
    ),
    "not in the enum": (
        call("search", query="q", mode="blog"),
        "Error: invalid arguments for 'search': argument 'mode': 'blog' is not one of "
        "['web', 'news']. Expected search(query: string, mode?: \"web\" | \"news\", "
        "ids?: array[integer], opts?: object)",
    ),
}


@pytest.mark.parametrize(("attempt", "content"), BAD_CALLS.values(), ids=BAD_CALLS)
def test_arguments_the_schema_refuses_are_errors_that_name_the_field(attempt, content):
    box = ToolBox([schema_tool(ADD, add_sync), schema_tool(SEARCH, search)])
    assert run_one(box, attempt) == ToolResult(
        attempt.call.name, content, ToolErrorKind.INVALID_ARGUMENTS
    )


def test_keys_the_schema_does_not_forbid_are_passed_on():
    box = ToolBox([schema_tool(SEARCH, search)])
    assert run_one(box, call("search", query="q", extra=1)).content == '{"query": "q", "extra": 1}'


def test_schema_returns_the_given_schema_in_the_openai_form():
    assert schema_tool(ADD, add_sync).schema() == ADD
    assert schema_tool(SEARCH, search).schema() == {"type": "function", "function": SEARCH}


def test_the_schema_is_copied_in_and_out():
    given = {"name": "f", "parameters": {"type": "object", "properties": {}}}
    made = schema_tool(given, search)
    given["parameters"]["properties"]["x"] = {"type": "string"}
    made.schema()["function"]["parameters"]["required"] = ["y"]
    assert made.schema() == {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
    }


BAD_SCHEMAS = {
    "an unknown type": (
        {"name": "bad", "parameters": {"type": "object", "properties": {"a": {"type": "int"}}}},
        r"tool 'bad': parameters\['properties'\]\['a'\]\['type'\] is not a valid JSON schema",
    ),
    "parameters not an object schema": (
        {"name": "bad", "parameters": {"type": "array"}},
        r"tool 'bad': parameters must be a JSON schema of type 'object'",
    ),
    "required not a list": (
        {"name": "bad", "parameters": {"type": "object", "required": "a"}},
        r"tool 'bad': parameters\['required'\] is not a valid JSON schema",
    ),
    "a name with a space": ({"name": "two words"}, r"tool name 'two words' must be 1-64"),
    "no name": ({"description": "x"}, r"tool name None must be"),
    "type not function": ({"type": "tool", "function": {"name": "f"}}, r"'function', got 'tool'"),
    "keys beside function": (
        {"type": "function", "function": {"name": "f"}, "name": "f"},
        r"unexpected keys \['name'\]",
    ),
    "description not a string": (
        {"name": "f", "description": 3},
        r"tool 'f': description must be a string",
    ),
}


@pytest.mark.parametrize(("schema", "says"), BAD_SCHEMAS.values(), ids=BAD_SCHEMAS)
def test_a_bad_schema_is_refused_when_the_tool_is_made(schema, says):
    with pytest.raises(ValueError, match=says):
        schema_tool(schema, search)


def test_decorator_form_timeout_and_direct_call():
    @schema_tool(ADD, timeout_s=2.0)
    async def add(a, b=1):
        return a + b

    assert isinstance(add, SchemaTool)
    assert (add.name, add.description, add.timeout_s) == ("add", "Adds two integers.", 2.0)
    assert add(a=1, b=2) == 3
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        schema_tool(ADD, add_sync, timeout_s=0)


def test_an_async_tool_past_its_limit_times_out_and_is_then_cancelled():
    cancelled = threading.Event()

    async def nap(seconds):
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    box = ToolBox([schema_tool({"name": "nap"}, nap, timeout_s=0.2)])
    start = time.monotonic()
    result = run_one(box, call("nap", seconds=30))
    assert time.monotonic() - start < 0.2 + 0.5
    assert result == ToolResult(
        "nap", "Error: tool 'nap' did not finish within 0.2 s", ToolErrorKind.TIMEOUT
    )
    assert not cancelled.is_set()  # the grace period has not passed yet
    assert cancelled.wait(5.0)


def test_an_async_tool_runs_inline_from_inside_a_running_event_loop():
    box = ToolBox([schema_tool(ADD, add_async)], default_timeout_s=None)

    async def agent():
        return box.run([call("add", a=40, b=2)])

    assert asyncio.run(agent()) == [ToolResult("add", "42", None)]


def test_a_raising_callable_is_a_tool_raised_result():
    async def fail(**kwargs):
        raise ValueError("no such city")

    result = run_one(ToolBox([schema_tool({"name": "fail"}, fail)]), call("fail"))
    assert result == ToolResult(
        "fail", "Error: 'fail' raised ValueError: no such city", ToolErrorKind.TOOL_RAISED
    )


# -- typed tools are unchanged -----------------------------------------------------


@tool
def area(width: float, height: float = 1.0, unit: str = "m") -> str:
    """Computes the area of a rectangle.

    Args:
        width: The width.
        height: The height.
    """
    return f"{width * height} {unit}^2"


def test_a_typed_tool_keeps_its_schema():
    assert area.schema() == {
        "type": "function",
        "function": {
            "name": "area",
            "description": "Computes the area of a rectangle.",
            "parameters": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "width": {"type": "number", "description": "The width."},
                    "height": {"type": "number", "default": 1.0, "description": "The height."},
                    "unit": {"type": "string", "default": "m"},
                },
                "required": ["width"],
            },
        },
    }


def test_a_typed_tool_keeps_its_error_texts_beside_a_schema_tool():
    box = ToolBox([area, schema_tool(ADD, add_sync)])
    results = box.run([call("area", width="2", depth=1), call("area", width=2), call("add", a=1)])
    assert results == [
        ToolResult(
            "area",
            "Error: invalid arguments for 'area': argument 'width': Input should be a valid "
            "number (got \"2\"); unexpected argument 'depth'. "
            'Expected area(width: float, height: float = 1.0, unit: str = "m")',
            ToolErrorKind.INVALID_ARGUMENTS,
        ),
        ToolResult("area", "2.0 m^2", None),
        ToolResult("add", "2", None),
    ]


# -- the protocol ------------------------------------------------------------------


class Broken:
    """A tool whose argument check and run both raise: the ToolBox must not."""

    name = "broken"
    timeout_s = None

    def schema(self):
        return {"type": "function", "function": {"name": "broken", "parameters": {}}}

    def check_arguments(self, arguments):
        if arguments:
            raise RuntimeError("checker bug")
        return {}

    def invoke(self, arguments, timeout_s):
        raise RuntimeError("runner bug")


class Slow(Broken):
    """A tool that reports a timeout itself and has no time limit at all."""

    name = "slow"
    timeout_s = float("inf")

    def invoke(self, arguments, timeout_s):
        assert timeout_s is None
        return CallOutcome(timed_out=True)


def test_any_tool_with_the_protocol_runs_and_its_bugs_become_results():
    box = ToolBox([Broken(), Slow()])
    assert box.run([call("broken", x=1), call("broken"), call("slow")]) == [
        ToolResult(
            "broken",
            "Error: invalid arguments for 'broken': the arguments could not be checked: "
            "RuntimeError: checker bug",
            ToolErrorKind.INVALID_ARGUMENTS,
        ),
        ToolResult(
            "broken", "Error: 'broken' raised RuntimeError: runner bug", ToolErrorKind.TOOL_RAISED
        ),
        ToolResult("slow", "Error: tool 'slow' did not finish", ToolErrorKind.TIMEOUT),
    ]


def test_the_toolbox_refuses_what_is_not_a_tool():
    with pytest.raises(TypeError, match=r"ToolBox takes tools \(a function decorated with @tool"):
        ToolBox([add_sync])
