"""The Llama 3.x JSON parser reads calls as that family writes them: one object, several
separated by `;` or newlines, back to back (`{...}{...}`), or a JSON list; each optionally
after `<|python_tag|>`. Property-based: any names and arguments, any of the layouts."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym.tools import ToolErrorKind
from agentgym.tools.native import get_parser
from agentgym.types import ToolCall

PARSER = get_parser("llama3_json")

names = st.from_regex(r"[a-z][a-z0-9_]{0,15}(\.[a-z][a-z0-9_]{0,10})?", fullmatch=True)
scalars = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=12)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)
arguments = st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), values, max_size=4)
calls = st.lists(st.builds(ToolCall, names, arguments), min_size=1, max_size=4)
key = st.sampled_from(["parameters", "arguments"])


def _object(call: ToolCall, key: str) -> str:
    return json.dumps({"name": call.name, key: dict(call.arguments)}, ensure_ascii=False)


LAYOUTS = {
    "semicolons": lambda objs: "; ".join(objs),
    "newlines": lambda objs: "\n".join(objs),
    "back to back": lambda objs: "".join(objs),
    "json list": lambda objs: "[" + ", ".join(objs) + "]",
    "list per line": lambda objs: "\n".join(f"[{o}]" for o in objs),
}


@settings(max_examples=150, deadline=None)
@given(
    calls, key, st.sampled_from(sorted(LAYOUTS)), st.booleans(), st.sampled_from(["", " ", "\n"])
)
def test_every_layout_of_any_calls_parses_back_to_them(calls, key, layout, tagged, pad):
    text = LAYOUTS[layout]([_object(c, key) for c in calls])
    text = pad + ("<|python_tag|>" if tagged else "") + text + pad
    parsed = PARSER.parse(text)
    assert [a.error for a in parsed.calls] == [None] * len(calls), text
    assert [a.call for a in parsed.calls] == calls
    assert parsed.final_answer is None


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("The answer is \\boxed{7}.", "7"),
        ("[1, 2] so \\boxed{3}", "3"),  # a list of numbers is no call
        ("[] is empty: \\boxed{0}", "0"),
    ],
)
def test_prose_and_lists_of_other_things_are_answers_not_calls(text, answer):
    parsed = PARSER.parse(text)
    assert parsed.calls == () and parsed.final_answer == answer


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ('{"name": "f", "parameters": {}} and then prose', ToolErrorKind.INVALID_JSON),
        ('[{"name": "f", "parameters": {}}, 3]', None),  # the 3 is one failed attempt
        ("<|python_tag|>[]", ToolErrorKind.INVALID_JSON),
        ('{"name": "f", "parameters": {}}\n{"name": "g", "param', ToolErrorKind.INVALID_JSON),
    ],
)  # fmt: skip
def test_malformed_layouts_are_named_errors(text, kind):
    parsed = PARSER.parse(text)
    if kind is None:
        assert [a.call.name if a.call else a.error for a in parsed.calls] == [
            "f", ToolErrorKind.INVALID_JSON,
        ]  # fmt: skip
    else:
        assert [a.error for a in parsed.calls] == [kind]


def test_a_call_cut_off_in_the_second_object_is_truncated():
    text = '{"name": "f", "parameters": {}}; {"name": "g", "param'
    parsed = PARSER.parse(text, truncated=True)
    assert [a.error for a in parsed.calls] == [ToolErrorKind.TRUNCATED]
