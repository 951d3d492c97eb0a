"""Text inside the model's thinking never executes as a call nor answers: `<think>` blocks,
the text before a `</think>` the template opened, and an unclosed block's rest. Every format
the env reads (Hermes, ReAct, each native parser) reads only what is outside. Property-based:
any calls, placed inside and outside thinking in any order."""

from __future__ import annotations

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentgym  # noqa: F401  (registers the built-in environments)
from agentgym.text import outside_thinking
from agentgym.tools import HERMES, REACT
from agentgym.tools.native import NativeFormat, get_parser
from agentgym.types import ToolCall

FORMATS = {
    "hermes": HERMES,
    "react": REACT,
    "native-hermes": NativeFormat(get_parser("hermes")),
    "native-llama3_json": NativeFormat(get_parser("llama3_json")),
    "native-mistral": NativeFormat(get_parser("mistral")),
}

names = st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True)
calls = st.builds(
    ToolCall, names, st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), st.integers())
)
prose = st.text(st.characters(blacklist_characters="<>{}[]\\"), max_size=30)


@pytest.mark.parametrize(
    ("text", "outside"),
    [
        ("<think>a</think>b", "b"),
        ("a</think>b", "b"),  # the template opened the block
        ("a<think>b", "a"),  # cut off while thinking
        ("<think>a</think>b<think>c</think>d", "bd"),
        ("no thinking", "no thinking"),
        ("a</think>b<think>c", "b"),
    ],
)
def test_what_is_outside_thinking(text, outside):
    assert outside_thinking(text) == outside


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(FORMATS)), calls, calls, prose, st.booleans())
def test_a_call_in_the_thinking_never_runs_and_the_one_after_it_does(
    name, hidden, real, words, opened
):
    fmt = FORMATS[name]
    head = "" if opened else "<think>"  # opened: the generation prompt holds <think>
    text = f"{head}{words}{fmt.render_call(hidden)}\\boxed{{1}}</think>\n{fmt.render_call(real)}"
    parsed = fmt.parse(text)
    assert [a.call for a in parsed.calls] == [real], text


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_turn_that_only_thinks_has_no_call_and_no_answer(name):
    fmt = FORMATS[name]
    hidden = ToolCall("calculator", {"expression": "1+1"})
    parsed = fmt.parse(f"<think>{fmt.render_call(hidden)} so \\boxed{{2}}")
    assert parsed.calls == () and parsed.final_answer is None


def test_the_env_runs_only_the_call_after_the_thinking():
    env = gym.make("agentgym/ToolCall-v0", families=["calculator"])
    env.reset(seed=0)
    hidden = HERMES.render_call(ToolCall("calculator", {"expression": "2**10"}))
    real = HERMES.render_call(ToolCall("calculator", {"expression": "6*7"}))
    turn = f"<think>maybe {hidden}</think>{real}"
    obs, _, terminated, _, info = env.step(turn)
    assert not terminated and [m["role"] for m in obs] == ["tool"]
    assert obs[0]["content"] == "42" and info.get("tool_errors", {}) == {}
