"""Tools from typed functions, the Hermes and ReAct call formats, and the ToolBox's errors."""

from __future__ import annotations

import json
import time
from typing import Literal

import pytest

from agentgym.tools import (
    FORMATS,
    HERMES,
    REACT,
    CallAttempt,
    ParsedTurn,
    ToolBox,
    ToolErrorKind,
    ToolResult,
    error_counts,
    get_format,
    tool,
)
from agentgym.types import Message, ToolCall


@tool
def add(a: int, b: int) -> int:
    """Adds two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


@tool
def scale(x: float, factor: float = 2.0) -> float:
    """Multiplies a number by a factor."""
    return x * factor


@tool
def fail(reason: str) -> str:
    """Always raises ValueError."""
    raise ValueError(reason)


@tool(timeout_s=0.2)
def nap(seconds: float) -> str:
    """Sleeps, then says so."""
    time.sleep(seconds)
    return "slept"


@tool
def echo(text: str) -> str:
    """Returns its input."""
    return text


def box(**kwargs) -> ToolBox:
    return ToolBox([add, scale, fail, nap, echo], **kwargs)


def hermes(name: str, arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def run_hermes(text: str, **kwargs) -> list[ToolResult]:
    return box(**kwargs).run(HERMES.parse(text).calls)


# -- tools from functions ------------------------------------------------------


def test_schema_comes_from_the_signature_and_google_docstring():
    @tool
    def search(
        query: str,
        limit: int,
        ids: list[int],
        mode: Literal["web", "news"] = "web",
        threshold: float | None = None,
        exact: bool = False,
    ) -> list[str]:
        """Searches the index.

        Only the first paragraph is the description.

        Args:
            query: Words to look for,
                over two lines.
            limit (int): At most this many hits.
            ids: Documents to search in.
            mode: Which index.

        Returns:
            The hits.
        """
        return []

    assert search.schema() == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Searches the index.",
            "parameters": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "query": {
                        "type": "string",
                        "description": "Words to look for, over two lines.",
                    },
                    "limit": {"type": "integer", "description": "At most this many hits."},
                    "ids": {
                        "type": "array",
                        "items": {"type": "integer"},
                        "description": "Documents to search in.",
                    },
                    "mode": {
                        "type": "string",
                        "enum": ["web", "news"],
                        "default": "web",
                        "description": "Which index.",
                    },
                    "threshold": {
                        "anyOf": [{"type": "number"}, {"type": "null"}],
                        "default": None,
                    },
                    "exact": {"type": "boolean", "default": False},
                },
                "required": ["query", "limit", "ids"],
            },
        },
    }


def test_decorator_options_and_direct_call():
    @tool(name="plus", timeout_s=1.5)
    def add_numbers(a: int, b: int = 1) -> int:
        """Adds."""
        return a + b

    assert (add_numbers.name, add_numbers.timeout_s) == ("plus", 1.5)
    assert add_numbers(a=2) == 3
    assert add(2, 3) == 5


def test_a_parameter_without_annotation_is_a_type_error_naming_it():
    def untyped(a: int, b):
        """Nothing."""

    with pytest.raises(TypeError, match=r"untyped.*'b'.*annotation"):
        tool(untyped)


@pytest.mark.parametrize("signature", ["*args: int", "**kwargs: int", "a: int, /"])
def test_varargs_and_positional_only_parameters_are_refused(signature):
    namespace: dict = {}
    exec(f"def f({signature}) -> None:\n    '''Nothing.'''", namespace)
    with pytest.raises(TypeError, match="named arguments only"):
        tool(namespace["f"])


def test_a_parameter_named_like_a_pydantic_attribute_still_works():
    @tool
    def lookup(schema: str, model_name: str) -> str:
        """Looks up a table."""
        return f"{schema}.{model_name}"

    params = lookup.schema()["function"]["parameters"]
    assert params["required"] == ["schema", "model_name"]
    result = ToolBox([lookup]).run(
        HERMES.parse(hermes("lookup", {"schema": "s", "model_name": "t"})).calls
    )
    assert result == [ToolResult("lookup", "s.t", None)]


# -- running valid calls -------------------------------------------------------


def test_hermes_calls_run_and_several_per_turn_keep_their_order():
    text = (
        "Let me compute.\n<tool_call>\n"
        '{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
        '<tool_call>{"name": "scale", "arguments": {"x": 1.5}}</tool_call>'
    )
    assert run_hermes(text) == [ToolResult("add", "5", None), ToolResult("scale", "3.0", None)]


def test_react_call_runs():
    text = 'Thought: I should add.\nAction: add\nAction Input: {"a": 2, "b": 40}'
    turn = REACT.parse(text)
    assert turn == ParsedTurn((CallAttempt(ToolCall("add", {"a": 2, "b": 40}), None),), None)
    assert box().run(turn.calls) == [ToolResult("add", "42", None)]


def test_react_action_input_may_span_lines_and_every_action_is_parsed():
    text = (
        'Action: add\nAction Input: {\n  "a": 1,\n  "b": 2\n}\n'
        'Observation: (made up)\nThought: again\nAction: echo\nAction Input: {"text": "hi"}'
    )
    calls = [a.call for a in REACT.parse(text).calls]
    assert calls == [ToolCall("add", {"a": 1, "b": 2}), ToolCall("echo", {"text": "hi"})]


@pytest.mark.parametrize(
    "body",
    [
        '  \n {"name": "add", "arguments": {"a": 1, "b": 2}} \n ',
        '```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```',
        '{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}',  # OpenAI-style string
        '[{"name": "add", "arguments": {"a": 1, "b": 2}}]',
    ],
)
def test_hermes_tolerates_whitespace_fences_string_arguments_and_lists(body):
    turn = HERMES.parse(f"<tool_call>{body}</tool_call>")
    assert turn.calls == (CallAttempt(ToolCall("add", {"a": 1, "b": 2}), None),)


def test_results_are_json_for_containers_and_str_otherwise():
    @tool
    def info(kind: str) -> object:
        """Returns data of some kind."""
        return {"a": [1, "é"]} if kind == "dict" else None

    tb = ToolBox([info])
    calls = HERMES.parse(hermes("info", {"kind": "dict"}) + hermes("info", {"kind": "none"}))
    assert [r.content for r in tb.run(calls.calls)] == ['{"a": [1, "é"]}', "None"]


def test_long_results_are_truncated_with_a_visible_marker():
    [result] = run_hermes(hermes("echo", {"text": "x" * 25}), max_result_chars=10)
    assert result == ToolResult("echo", "x" * 10 + "\n...[truncated 15 chars]", None)


# -- every error kind ------------------------------------------------------------

ERROR_CASES = {
    "trailing comma": (
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2,}}</tool_call>',
        {},
        ToolErrorKind.INVALID_JSON,
        "invalid JSON in <tool_call>",
    ),
    "unclosed tag": (
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}',
        {},
        ToolErrorKind.INVALID_JSON,
        "unclosed <tool_call>",
    ),
    "no name": (
        '<tool_call>{"arguments": {"a": 1}}</tool_call>',
        {},
        ToolErrorKind.MISSING_NAME,
        '"name"',
    ),
    "name not a string": (
        '<tool_call>{"name": 7, "arguments": {}}</tool_call>',
        {},
        ToolErrorKind.MISSING_NAME,
        "got name 7",
    ),
    "unknown tool": (
        hermes("ad", {"a": 1, "b": 2}),
        {},
        ToolErrorKind.UNKNOWN_TOOL,
        "available tools: add, scale, fail, nap, echo. Did you mean 'add'?",
    ),
    "arguments a list": (
        hermes("add", [1, 2]),
        {},
        ToolErrorKind.ARGUMENTS_NOT_OBJECT,
        "must be a JSON object, got an array",
    ),
    "arguments beside the name": (
        '<tool_call>{"name": "add", "a": 1, "b": 2}</tool_call>',
        {},
        ToolErrorKind.ARGUMENTS_NOT_OBJECT,
        "'a', 'b'",
    ),
    "not an integer": (
        hermes("add", {"a": "abc", "b": 2}),
        {},
        ToolErrorKind.INVALID_ARGUMENTS,
        "argument 'a': Input should be a valid integer",
    ),
    "numeric string is not coerced": (
        hermes("add", {"a": "3", "b": 2}),
        {},
        ToolErrorKind.INVALID_ARGUMENTS,
        "argument 'a'",
    ),
    "missing argument": (
        hermes("add", {"a": 1}),
        {},
        ToolErrorKind.INVALID_ARGUMENTS,
        "missing required argument 'b'. Expected add(a: int, b: int)",
    ),
    "extra argument": (
        hermes("add", {"a": 1, "b": 2, "c": 3}),
        {},
        ToolErrorKind.INVALID_ARGUMENTS,
        "unexpected argument 'c'",
    ),
    "arguments too large": (
        hermes("echo", {"text": "x" * 50}),
        {"max_argument_chars": 20},
        ToolErrorKind.ARGUMENTS_TOO_LARGE,
        "the limit is 20",
    ),
    "tool raised": (
        hermes("fail", {"reason": "no such city"}),
        {},
        ToolErrorKind.TOOL_RAISED,
        "'fail' raised ValueError: no such city",
    ),
}


@pytest.mark.parametrize(("text", "options", "kind", "says"), ERROR_CASES.values(), ids=ERROR_CASES)
def test_each_bad_call_gives_its_error_kind_and_says_what_was_wrong(text, options, kind, says):
    [result] = run_hermes(text, **options)
    assert result.error is kind
    assert result.content.startswith("Error: ")
    assert says in result.content


def test_a_cut_off_call_is_truncated_in_both_formats():
    [hermes_call] = HERMES.parse('<tool_call>{"name": "add", "argu', truncated=True).calls
    [react_call] = REACT.parse('Action: add\nAction Input: {"a": 1, "b"', truncated=True).calls
    [no_input] = REACT.parse("Thought: go\nAction: add", truncated=True).calls
    assert hermes_call.error == react_call.error == no_input.error == ToolErrorKind.TRUNCATED
    assert "cut off" in hermes_call.message


def test_react_malformed_calls():
    text = (
        'Action: add\nThought: hm\nAction: add\nAction Input: {"a": 1,}\nAction:\nAction Input: {}'
    )
    no_input, bad_json, no_name = REACT.parse(text).calls
    assert no_input.error is ToolErrorKind.INVALID_JSON
    assert "needs an 'Action Input:' line" in no_input.message
    assert bad_json.error is ToolErrorKind.INVALID_JSON
    assert "invalid JSON in 'Action Input:'" in bad_json.message
    assert no_name.error is ToolErrorKind.MISSING_NAME


def test_calls_beyond_the_limit_are_not_run():
    runs = []

    @tool
    def count(n: int) -> int:
        """Counts a call."""
        runs.append(n)
        return n

    text = "".join(hermes("count", {"n": n}) for n in range(3))
    results = ToolBox([count], max_calls_per_turn=2).run(HERMES.parse(text).calls)
    assert runs == [0, 1]
    assert [r.error for r in results] == [None, None, ToolErrorKind.TOO_MANY_CALLS]
    assert "at most 2 tool calls per turn" in results[2].content


def test_a_tool_past_its_time_limit_times_out_promptly():
    start = time.monotonic()
    [result] = run_hermes(hermes("nap", {"seconds": 5}))
    assert time.monotonic() - start < 0.2 + 0.5
    assert result.error is ToolErrorKind.TIMEOUT
    assert "did not finish within 0.2 s" in result.content


def test_every_error_kind_is_covered_above():
    covered = {case[2] for case in ERROR_CASES.values()}
    covered |= {ToolErrorKind.TRUNCATED, ToolErrorKind.TOO_MANY_CALLS, ToolErrorKind.TIMEOUT}
    assert covered == set(ToolErrorKind)


def test_python_built_calls_with_bad_shapes_are_errors_not_exceptions():
    attempts = [CallAttempt(ToolCall("add", [1, 2]), None), CallAttempt(ToolCall("", {}), None)]
    kinds = [r.error for r in box().run(attempts)]
    assert kinds == [ToolErrorKind.ARGUMENTS_NOT_OBJECT, ToolErrorKind.MISSING_NAME]


def test_strictness_int_is_a_float_but_bool_is_not_an_int():
    results = run_hermes(hermes("scale", {"x": 3}) + hermes("add", {"a": True, "b": 1}))
    assert results[0] == ToolResult("scale", "6.0", None)
    assert results[1].error is ToolErrorKind.INVALID_ARGUMENTS


def test_error_counts_counts_only_kinds_that_occurred():
    results = run_hermes(hermes("add", {"a": 1, "b": 2}) + hermes("nope", {}) * 2 + "<tool_call>{")
    assert error_counts(results) == {"unknown_tool": 2, "invalid_json": 1}
    assert error_counts([]) == {}


# -- formats: final answers, round trips, observations, instructions ------------


@pytest.mark.parametrize(
    ("fmt", "text", "answer"),
    [
        (HERMES, r"So the total is \boxed{42}.", "42"),
        (HERMES, hermes("echo", {"text": r"\boxed{1}"}) + r" then \boxed{2}", "2"),
        (HERMES, "no answer yet", None),
        (REACT, "Thought: done\nFinal Answer: Paris, France\n", "Paris, France"),
        (REACT, r"Thought: done, \boxed{7}", "7"),
        (REACT, "Thought: still thinking", None),
    ],
)
def test_final_answers(fmt, text, answer):
    assert fmt.parse(text).final_answer == answer


def test_text_without_calls_or_answer_parses_to_nothing():
    for fmt in FORMATS.values():
        assert fmt.parse("I am not sure yet.") == ParsedTurn(calls=(), final_answer=None)


@pytest.mark.parametrize("fmt", [HERMES, REACT], ids=["hermes", "react"])
def test_render_call_parses_back_to_the_same_call(fmt):
    call = ToolCall("search", {"q": 'naïve "quotes"\nAction: x </tool_call><tool_call>', "k": [1]})
    assert fmt.parse(fmt.render_call(call)).calls == (CallAttempt(call, None),)


def test_rendered_calls():
    call = ToolCall("add", {"a": 1, "b": 2})
    assert HERMES.render_call(call) == (
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    )
    assert REACT.render_call(call) == 'Action: add\nAction Input: {"a": 1, "b": 2}'


def test_observations():
    results = [
        ToolResult("add", "3", None),
        ToolResult("", "Error: bad", ToolErrorKind.INVALID_JSON),
    ]
    assert HERMES.observation(results) == [
        Message("tool", "3", name="add"),
        Message("tool", "Error: bad", name=None),
    ]
    assert REACT.observation(results[:1]) == [Message("user", "Observation: 3")]
    assert REACT.observation(results) == [
        Message("user", "Observation 1: 3\n\nObservation 2: Error: bad")
    ]
    assert REACT.observation([]) == []


def test_instructions_hold_the_schemas_and_the_call_syntax():
    hermes_text = HERMES.instructions([add])
    assert json.dumps(add.schema()) in hermes_text
    assert "<tool_call>" in hermes_text and "\\boxed{" in hermes_text
    react_text = REACT.instructions([add, echo])
    assert "Action: the tool to call, one of [add, echo]" in react_text
    assert "Action Input:" in react_text and "Final Answer:" in react_text


def test_get_format_and_its_error():
    assert get_format("react") is REACT
    with pytest.raises(ValueError, match="valid: hermes, react"):
        get_format("xml")


def test_toolbox_rejects_duplicate_names_and_lists_schemas():
    with pytest.raises(ValueError, match="'add'"):
        ToolBox([add, add])
    assert [s["function"]["name"] for s in box().schemas()] == [
        "add",
        "scale",
        "fail",
        "nap",
        "echo",
    ]


@pytest.mark.parametrize("truncated", [False, True])
def test_every_prefix_of_a_turn_parses_and_runs_without_raising(truncated):
    turns = [
        "Thought: add\n"
        + REACT.render_call(ToolCall("add", {"a": 1, "b": 2}))
        + "\nFinal Answer: 3",
        "ok " + HERMES.render_call(ToolCall("echo", {"text": "}{<tool_call>"})) + r" \boxed{3}",
    ]
    for fmt, text in zip([REACT, HERMES], turns, strict=True):
        for end in range(len(text) + 1):
            turn = fmt.parse(text[:end], truncated=truncated)
            assert len(box().run(turn.calls)) == len(turn.calls)
