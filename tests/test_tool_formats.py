"""The Hermes and ReAct parsers: exact results for each branch, and properties over any text.

A model under reward pressure writes anything, so the parsers are also checked
with hypothesis: they never raise, always return well-formed attempts, and read
back every call `render_call` writes, whatever its arguments hold.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agentgym.tools.formats import (
    FORMATS,
    HERMES,
    REACT,
    CallAttempt,
    ParsedTurn,
    ToolErrorKind,
)
from agentgym.types import ToolCall

INVALID, CUT = ToolErrorKind.INVALID_JSON, ToolErrorKind.TRUNCATED


def outcomes(turn: ParsedTurn) -> list[ToolCall | ToolErrorKind]:
    """Each attempt as its call, or as its error kind when it failed."""
    return [a.call if a.error is None else a.error for a in turn.calls]


# -- each branch, exactly ---------------------------------------------------------

BRANCHES = {
    "a second tag opened before the first closes": (
        '<tool_call>{"name": "a", "arguments": {}}\n'
        '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>',
        False,
        [INVALID, ToolCall("b", {"x": 1})],
    ),
    "a reopened tag is not cut off, even in a truncated turn": (
        '<tool_call>{"name": "a"<tool_call>{"name": "b"}</tool_call>',
        True,
        [INVALID, ToolCall("b", {})],
    ),
    "only the last of two unclosed tags is cut off": (
        '<tool_call>{"name": "a"<tool_call>{"name": "b", "argu',
        True,
        [INVALID, CUT],
    ),
    "two unclosed tags in a finished turn": (
        '<tool_call>{"name": "a"<tool_call>{"name": "b", "argu',
        False,
        [INVALID, INVALID],
    ),
    "a stray closing tag is ignored": (
        '</tool_call><tool_call>{"name": "a"}</tool_call></tool_call>',
        False,
        [ToolCall("a", {})],
    ),
    "a call without arguments has none": (
        '<tool_call>{"name": "now"}</tool_call>',
        False,
        [ToolCall("now", {})],
    ),
    "a list mixing a call without arguments and a non-object": (
        '<tool_call>[{"name": "now"}, {"name": "add", "arguments": {"a": 1}}, 3]</tool_call>',
        False,
        [ToolCall("now", {}), ToolCall("add", {"a": 1}), INVALID],
    ),
    "an empty list is not a call": ("<tool_call>[]</tool_call>", False, [INVALID]),
    "a bare string is not a call": ('<tool_call>"add"</tool_call>', False, [INVALID]),
    "a blank name": (
        '<tool_call>{"name": "  ", "arguments": {}}</tool_call>',
        False,
        [ToolErrorKind.MISSING_NAME],
    ),
    "arguments null": (
        '<tool_call>{"name": "f", "arguments": null}</tool_call>',
        False,
        [ToolErrorKind.ARGUMENTS_NOT_OBJECT],
    ),
    "arguments a string holding an array": (
        '<tool_call>{"name": "f", "arguments": "[1, 2]"}</tool_call>',
        False,
        [ToolErrorKind.ARGUMENTS_NOT_OBJECT],
    ),
}


@pytest.mark.parametrize(("text", "truncated", "expected"), BRANCHES.values(), ids=BRANCHES)
def test_hermes_branches(text, truncated, expected):
    assert outcomes(HERMES.parse(text, truncated=truncated)) == expected


def test_hermes_says_which_tag_was_left_open_and_reads_no_answer_inside_it():
    text = r'<tool_call>\boxed{1}<tool_call>{"name": "b"}</tool_call> \boxed{2}'
    turn = HERMES.parse(text)
    assert turn.calls[0] == CallAttempt(
        None, INVALID, "unclosed <tool_call>: end every call with </tool_call>"
    )
    assert turn.final_answer == "2"
    assert HERMES.parse(r"<tool_call>\boxed{1}<tool_call>").final_answer is None


def test_hermes_ignores_a_stray_closing_tag_around_the_final_answer():
    turn = HERMES.parse(r"</tool_call>The answer is \boxed{4}.</tool_call>")
    assert turn == ParsedTurn(calls=(), final_answer="4")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused_as_invalid_json(constant):
    hermes = HERMES.parse(
        f'<tool_call>{{"name": "f", "arguments": {{"x": {constant}}}}}</tool_call>'
    )
    react = REACT.parse(f'Action: f\nAction Input: {{"x": [1, {constant}]}}')
    assert hermes.calls == (
        CallAttempt(None, INVALID, f"invalid JSON in <tool_call>: {constant} is not valid JSON"),
    )
    assert react.calls == (
        CallAttempt(
            None, INVALID, f"invalid JSON in 'Action Input:': {constant} is not valid JSON"
        ),
    )
    # OpenAI-style arguments, a string holding the object, are refused alike
    encoded = HERMES.parse(
        f'<tool_call>{{"name": "f", "arguments": "{{\\"x\\": {constant}}}"}}</tool_call>'
    )
    assert outcomes(encoded) == [ToolErrorKind.ARGUMENTS_NOT_OBJECT]


@pytest.mark.parametrize("number", ["1e999", "-1E+400", "1.5e309"])
def test_numbers_that_overflow_to_infinity_are_refused_too(number):
    """`json.loads` reads 1e999 as inf: without a check, a tool would get the infinity that
    "Infinity" is refused for, and `render_call` would write it back as invalid JSON."""
    hermes = HERMES.parse(f'<tool_call>{{"name": "f", "arguments": {{"x": {number}}}}}</tool_call>')
    react = REACT.parse(f'Action: f\nAction Input: {{"x": {{"y": {number}}}}}')
    assert outcomes(hermes) == outcomes(react) == [INVALID]
    assert hermes.calls[0].message == f"invalid JSON in <tool_call>: {number} is out of range"


REACT_BRANCHES = {
    "only the last bad input of a truncated turn is cut off": (
        'Action: a\nAction Input: {"x": 1,\nAction: b\nAction Input: {"y"',
        True,
        [INVALID, CUT],
    ),
    "an action followed by an action has no input": (
        "Action: a\nAction: b\nAction Input: {}",
        True,
        [INVALID, ToolCall("b", {})],
    ),
    "prose lines between the action and its input": (
        "Action: search\nthe web, I mean\nAction Input: {}",
        False,
        [ToolCall("search", {})],
    ),
    "an input ends at the next keyword line": (
        'Action: a\nAction Input: {"x": 1}\nFinal Answer: 2',
        True,
        [ToolCall("a", {"x": 1})],
    ),
    "an input that is not an object": (
        "Action: a\nAction Input: [1]",
        False,
        [ToolErrorKind.ARGUMENTS_NOT_OBJECT],
    ),
}


@pytest.mark.parametrize(
    ("text", "truncated", "expected"), REACT_BRANCHES.values(), ids=REACT_BRANCHES
)
def test_react_branches(text, truncated, expected):
    assert outcomes(REACT.parse(text, truncated=truncated)) == expected


# -- properties -------------------------------------------------------------------

# Pieces a model writes near tool calls, mixed with arbitrary unicode between them.
TAGS = ["<tool_call>", "</tool_call>", "```json\n", "```", "\\boxed{"]
REACT_WORDS = ["Action:", "Action: add", "Action Input:", "Thought:", "Observation:"]
JSON_BITS = ["{", "}", "[", "]", '"', ",", ":", "\\", "\n", " ", "NaN", "-Infinity", "1e999"]
CALL_BITS = ['"name"', '"arguments"', '"add"', "null", '{"name": "add", "arguments": {"a": 1}}']
PIECES = [*TAGS, *REACT_WORDS, "Final Answer:", *JSON_BITS, *CALL_BITS]


def text_of(pieces: list[str]) -> st.SearchStrategy[str]:
    """Text joined from `pieces` (two thirds) and short runs of arbitrary unicode."""
    piece = st.sampled_from(pieces)
    return st.lists(st.one_of(piece, piece, st.text(max_size=6)), max_size=30).map("".join)


model_text = text_of(PIECES)
# the same without the text that opens a call
no_tag = text_of([p for p in PIECES if "<tool_call>" not in p]).filter(
    lambda s: "<tool_call>" not in s
)
no_action = text_of([p for p in PIECES if "Action:" not in p]).filter(lambda s: "Action:" not in s)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | model_text
)
keys = st.text() | model_text
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)
arguments = st.dictionaries(keys, json_values, max_size=5)


# Hermes takes any name that is not blank; ReAct a name on one line, without
# surrounding whitespace, since the `Action:` line is stripped.
# A tool's name is never a thinking tag: the parsers read only the text outside thinking (an
# unclosed `<think>` hides all after it), so a name holding one cannot be read back.
def _no_thinking(name: str) -> bool:
    return "<think>" not in name and "</think>" not in name


hermes_names = (st.text(min_size=1) | model_text).filter(str.strip).filter(_no_thinking)
react_names = (st.text(min_size=1) | model_text).map(lambda s: s.replace("\n", " ").strip())
react_names = react_names.filter(bool).filter(_no_thinking)
formats = st.sampled_from(sorted(FORMATS))

quick = settings(deadline=None)  # the machine may be busy; a slow example is no failure


@quick
@given(fmt=formats, text=model_text | st.text(), truncated=st.booleans())
def test_any_text_parses_to_well_formed_attempts(fmt, text, truncated):
    turn = FORMATS[fmt].parse(text, truncated=truncated)
    assert isinstance(turn, ParsedTurn) and isinstance(turn.calls, tuple)
    assert turn.final_answer is None or isinstance(turn.final_answer, str)
    for attempt in turn.calls:
        if attempt.error is None:
            assert isinstance(attempt.call.name, str) and attempt.call.name.strip()
            assert isinstance(attempt.call.arguments, dict)
            assert attempt.message == ""
        else:
            assert attempt.call is None and isinstance(attempt.error, ToolErrorKind)
            assert attempt.message
    cut = [i for i, a in enumerate(turn.calls) if a.error is CUT]
    assert cut == ([len(turn.calls) - 1] if truncated and cut else [])  # only the last is cut


@quick
@given(fmt=formats, text=model_text)
def test_the_truncated_flag_changes_at_most_the_last_attempt_into_truncated(fmt, text):
    finished = FORMATS[fmt].parse(text)
    cut_off = FORMATS[fmt].parse(text, truncated=True)
    assert cut_off.final_answer == finished.final_answer
    assert len(cut_off.calls) == len(finished.calls)
    assert cut_off.calls[:-1] == finished.calls[:-1]
    if cut_off.calls and cut_off.calls[-1] != finished.calls[-1]:
        assert (finished.calls[-1].error, cut_off.calls[-1].error) == (INVALID, CUT)


@quick
@given(name=hermes_names, args=arguments)
def test_a_rendered_hermes_call_parses_back_to_the_same_call(name, args):
    call = ToolCall(name, args)
    assert HERMES.parse(HERMES.render_call(call)).calls == (CallAttempt(call, None),)


@quick
@given(name=react_names, args=arguments)
def test_a_rendered_react_call_parses_back_to_the_same_call(name, args):
    call = ToolCall(name, args)
    assert REACT.parse(REACT.render_call(call)).calls == (CallAttempt(call, None),)


@quick
@given(fmt=formats, text=model_text)
def test_a_parsed_call_renders_to_text_that_parses_to_it_again(fmt, text):
    for attempt in FORMATS[fmt].parse(text).calls:
        if attempt.call is not None:
            again = FORMATS[fmt].parse(FORMATS[fmt].render_call(attempt.call))
            assert again.calls == (attempt,)


@quick
@given(
    fmt=formats,
    number=st.from_regex(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]{1,4})?", fullmatch=True),
)
def test_a_json_number_reads_as_a_finite_number_or_is_refused(fmt, number):
    arguments = f'{{"x": {number}}}'
    text = {
        "hermes": f'<tool_call>{{"name": "f", "arguments": {arguments}}}</tool_call>',
        "react": f"Action: f\nAction Input: {arguments}",
    }[fmt]
    [attempt] = FORMATS[fmt].parse(text).calls
    if math.isinf(float(number)):
        assert attempt.error is INVALID and attempt.message.endswith(f"{number} is out of range")
    else:
        exact = float(number) if set(number) & set(".eE") else int(number)
        assert attempt.call == ToolCall("f", {"x": exact})


@quick
@given(
    prose=st.lists(no_tag, min_size=1, max_size=4),
    names=st.lists(hermes_names, min_size=3, max_size=3),
    args=st.lists(arguments, min_size=3, max_size=3),
)
def test_hermes_calls_amid_prose_parse_in_order_and_leave_the_final_answer_alone(
    prose, names, args
):
    assume("<tool_call>" not in "".join(prose))  # none formed where two pieces meet
    calls = [ToolCall(n, a) for n, a in zip(names, args, strict=True)][: len(prose) - 1]
    text = prose[0] + "".join(
        HERMES.render_call(c) + p for c, p in zip(calls, prose[1:], strict=True)
    )
    turn = HERMES.parse(text)
    assert turn.calls == tuple(CallAttempt(c, None) for c in calls)
    assert turn.final_answer == HERMES.parse("".join(prose)).final_answer


@quick
@given(
    thoughts=st.lists(no_action, min_size=1, max_size=3),
    names=st.lists(react_names, min_size=3, max_size=3),
    args=st.lists(arguments, min_size=3, max_size=3),
)
def test_react_calls_after_thoughts_parse_in_order(thoughts, names, args):
    calls = [ToolCall(n, a) for n, a in zip(names, args, strict=True)][: len(thoughts)]
    text = "\n".join(
        f"Thought: {t}\n{REACT.render_call(c)}" for t, c in zip(thoughts, calls, strict=True)
    )
    assert REACT.parse(text).calls == tuple(CallAttempt(c, None) for c in calls)


@quick
@given(text=no_tag, truncated=st.booleans())
def test_hermes_text_without_an_opening_tag_has_no_calls(text, truncated):
    assert HERMES.parse(text, truncated=truncated).calls == ()


@quick
@given(text=no_action, truncated=st.booleans())
def test_react_text_without_an_action_has_no_calls(text, truncated):
    assert REACT.parse(text, truncated=truncated).calls == ()
