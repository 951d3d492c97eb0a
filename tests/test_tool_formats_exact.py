"""What the model is told about each malformed call, word for word, and the parsers' edges.

Written against the mutants `make mutate` found alive in `agentgym.tools.formats`:
the error messages are the model's only feedback on a bad call, so each is
pinned; the rest are the Hermes tag scanner's and the ReAct reader's corners.
"""

from __future__ import annotations

import pytest

from agentgym.tools.formats import HERMES, REACT, CallAttempt, ToolErrorKind
from agentgym.types import ToolCall

INVALID, CUT = ToolErrorKind.INVALID_JSON, ToolErrorKind.TRUNCATED
NOT_OBJECT, NO_NAME = ToolErrorKind.ARGUMENTS_NOT_OBJECT, ToolErrorKind.MISSING_NAME


def attempts(fmt, text: str, truncated: bool = False) -> list[tuple]:
    """Each attempt as ("call", name, arguments) or (error kind, message)."""
    turn = fmt.parse(text, truncated=truncated)
    return [
        ("call", a.call.name, dict(a.call.arguments)) if a.call else (a.error, a.message)
        for a in turn.calls
    ]


def tagged(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


HERMES_MESSAGES = {
    "NaN": (
        tagged('{"name": "f", "arguments": {"x": NaN}}'),
        INVALID,
        "invalid JSON in <tool_call>: NaN is not valid JSON",
    ),
    "a number past float": (
        tagged('{"name": "f", "arguments": {"x": 1e999}}'),
        INVALID,
        "invalid JSON in <tool_call>: 1e999 is out of range",
    ),
    "not an object": (
        tagged('"f"'),
        INVALID,
        'a tool call must be a JSON object {"name": ..., "arguments": {...}}, got a string',
    ),
    "no name": (
        tagged('{"arguments": {}}'),
        NO_NAME,
        'a tool call needs "name": the tool\'s name as a non-empty string; got no name',
    ),
    "a name that is not a string": (
        tagged('{"name": ["é"]}'),
        NO_NAME,
        'a tool call needs "name": the tool\'s name as a non-empty string; got name ["é"]',
    ),
    "arguments beside the name": (
        tagged('{"name": "f", "x": 1}'),
        NOT_OBJECT,
        "put the arguments of 'f' inside \"arguments\": {...}; unexpected key(s) 'x' in the call",
    ),
    "arguments a string but not JSON": (
        tagged('{"name": "f", "arguments": "x=1"}'),
        NOT_OBJECT,
        "the arguments of 'f' are a string that is not a JSON object",
    ),
    "arguments a JSON string": (
        tagged('{"name": "f", "arguments": "\\"x\\""}'),
        NOT_OBJECT,
        "the arguments of 'f' must be a JSON object, got a string",
    ),
    "arguments an array": (
        tagged('{"name": "f", "arguments": [1]}'),
        NOT_OBJECT,
        "the arguments of 'f' must be a JSON object, got an array",
    ),
    "arguments a boolean": (
        tagged('{"name": "f", "arguments": true}'),
        NOT_OBJECT,
        "the arguments of 'f' must be a JSON object, got a boolean",
    ),
    "arguments null": (
        tagged('{"name": "f", "arguments": null}'),
        NOT_OBJECT,
        "the arguments of 'f' must be a JSON object, got null",
    ),
    "arguments a number": (
        tagged('{"name": "f", "arguments": 2.5}'),
        NOT_OBJECT,
        "the arguments of 'f' must be a JSON object, got a number",
    ),
}


@pytest.mark.parametrize(("text", "kind", "message"), HERMES_MESSAGES.values(), ids=HERMES_MESSAGES)
def test_hermes_tells_the_model_what_is_wrong_with_a_call(text, kind, message):
    assert attempts(HERMES, text) == [(kind, message)]


def test_hermes_tells_the_model_about_an_unclosed_or_cut_off_call():
    unclosed = '<tool_call>{"name": "f"'
    assert attempts(HERMES, unclosed) == [
        (INVALID, "unclosed <tool_call>: end every call with </tool_call>")
    ]
    assert attempts(HERMES, unclosed, truncated=True) == [
        (CUT, "the tool call was cut off by the length limit; write shorter calls")
    ]


REACT_MESSAGES = {
    "no tool name": (
        "Action: \nAction Input: {}",
        False,
        NO_NAME,
        "'Action:' must name the tool to call",
    ),
    "no input": (
        "Action: f\nThought: done",
        False,
        INVALID,
        "'Action: f' needs an 'Action Input:' line with the arguments as a JSON object "
        "({} for none)",
    ),
    "no input, cut off": ("Action: f", True, CUT, "the call was cut off by the length limit"),
    "bad input, cut off": (
        'Action: f\nAction Input: {"x": ',
        True,
        CUT,
        "the call was cut off by the length limit",
    ),
    "input that is not an object": (
        "Action: f\nAction Input: 3",
        False,
        NOT_OBJECT,
        "the arguments of 'f' must be a JSON object, got a number",
    ),
}


@pytest.mark.parametrize(
    ("text", "cut", "kind", "message"), REACT_MESSAGES.values(), ids=REACT_MESSAGES
)
def test_react_tells_the_model_what_is_wrong_with_a_call(text, cut, kind, message):
    assert attempts(REACT, text, truncated=cut) == [(kind, message)]


def test_a_call_attempt_with_both_or_neither_of_call_and_error_is_refused():
    message = r"^a CallAttempt has exactly one of `call` and `error`$"
    with pytest.raises(ValueError, match=message):
        CallAttempt(call=None, error=None)
    with pytest.raises(ValueError, match=message):
        CallAttempt(call=ToolCall("f", {}), error=INVALID)


# --- the Hermes tag scanner ---------------------------------------------------------------


def test_a_call_with_no_arguments_key_has_none():
    assert attempts(HERMES, tagged('{"name": "now"}')) == [("call", "now", {})]


def test_an_unclosed_call_does_not_swallow_the_calls_after_it():
    # the first tag is never closed: it is reported, and both later calls still run
    text = (
        '<tool_call>{"name": "a"\n'
        + tagged('{"name": "b", "arguments": {}}')
        + " and "
        + tagged('{"name": "c", "arguments": {"x": 1}}')
    )
    assert attempts(HERMES, text, truncated=True) == [
        (INVALID, "unclosed <tool_call>: end every call with </tool_call>"),
        ("call", "b", {}),
        ("call", "c", {"x": 1}),
    ]


def test_no_text_inside_a_tag_is_read_as_the_final_answer():
    # closed: the \boxed inside the arguments is no answer
    closed = tagged('{"name": "f", "arguments": {"x": "\\\\boxed{5}"}}')
    assert HERMES.parse(closed).final_answer is None
    # unclosed: what follows the tag is dropped, so an open \boxed{ before it stays open
    assert HERMES.parse('\\boxed{12<tool_call>{"a": 1}').final_answer is None


def test_the_text_around_calls_is_read_as_one_text():
    # the parts outside the tags are joined as they stand, with nothing between them
    text = "\\boxed{4" + tagged('{"name": "f"}') + "2}"
    assert HERMES.parse(text).final_answer == "42"


def test_render_call_writes_non_ascii_as_is():
    rendered = HERMES.render_call(ToolCall("lookup", {"city": "Zürich"}))
    assert (
        rendered == '<tool_call>\n{"name": "lookup", "arguments": {"city": "Zürich"}}\n</tool_call>'
    )
    assert REACT.render_call(ToolCall("f", {"s": "é"})) == 'Action: f\nAction Input: {"s": "é"}'


# --- the ReAct reader ------------------------------------------------------------------


def test_react_reads_a_turn_as_finished_unless_told_it_was_cut_off():
    assert attempts(REACT, "Action: f")[0][0] == INVALID


def test_only_a_call_that_ends_a_cut_off_turn_counts_as_cut_off():
    # a keyword line after the call: the turn went on past it, so the call is malformed
    assert attempts(REACT, "Action: f\nThought: wait", truncated=True)[0][0] == INVALID
    bad_input = "Action: f\nAction Input: {bad\nThought: wait"
    assert attempts(REACT, bad_input, truncated=True)[0][0] == INVALID


def test_react_takes_the_tool_name_from_the_action_line_alone():
    text = "Action: lookup\nthe city of the question\nand its country\nAction Input: {}"
    assert attempts(REACT, text) == [("call", "lookup", {})]
