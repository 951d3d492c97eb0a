"""Every tool-call parser answers any text (any nesting depth, any size, any character)
with parsed calls or error attempts, and `env.step` with an observation: never an exception.

The regression: a Hermes call whose arguments nested about 1,000 JSON arrays deep made
`env.step` raise RecursionError (json's decoder) instead of answering.
"""

from __future__ import annotations

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentgym  # noqa: F401  (registers the built-in environments)
from agentgym.tools import HERMES, REACT, ParsedTurn, ToolErrorKind
from agentgym.tools.formats import MAX_JSON_DEPTH
from agentgym.tools.native import ResponseSchemaParser, get_parser
from agentgym.types import Completion


def _schema_reader(text: str) -> dict:
    """A stand-in for `tokenizer.parse_response` (no tokenizer here ships a response schema):
    reads Hermes blocks with json, raising whatever json raises, as the real one would."""
    import json

    calls = []
    for chunk in text.split("<tool_call>")[1:]:
        calls.append({"type": "function", "function": json.loads(chunk.split("</tool_call>")[0])})
    return {"role": "assistant", "content": text.split("<tool_call>")[0], "tool_calls": calls}


PARSERS = {
    "hermes": HERMES,
    "react": REACT,
    "native-hermes": get_parser("hermes"),
    "native-llama3_json": get_parser("llama3_json"),
    "native-mistral": get_parser("mistral"),
    "native-response_schema": ResponseSchemaParser(_schema_reader, get_parser("hermes")),
}
WRAP = {
    "hermes": lambda body: f"<tool_call>{body}</tool_call>",
    "react": lambda body: f"Action: calculator\nAction Input: {body}",
    "native-hermes": lambda body: f"<tool_call>{body}</tool_call>",
    "native-llama3_json": lambda body: body,
    "native-mistral": lambda body: f"[TOOL_CALLS] [{body}]",
    "native-response_schema": lambda body: f"<tool_call>{body}</tool_call>",
}
ENV_FORMATS = {
    "hermes": {"tool_format": "hermes"},
    "react": {"tool_format": "react"},
    "native-hermes": {"tool_format": "native", "tool_parser": "hermes"},
    "native-llama3_json": {"tool_format": "native", "tool_parser": "llama3_json"},
    "native-mistral": {"tool_format": "native", "tool_parser": "mistral"},
}


def _nested(depth: int, opener: str = "[", closer: str = "]") -> str:
    return opener * depth + closer * depth


def _deep_call(depth: int) -> str:
    return '{"name": "calculator", "arguments": {"expression": ' + _nested(depth) + "}}"


def _answers(parser, text: str, truncated: bool = False) -> ParsedTurn:
    parsed = parser.parse(text, truncated=truncated)
    assert isinstance(parsed, ParsedTurn)
    for attempt in parsed.calls:
        assert (attempt.call is None) != (attempt.error is None)
    return parsed


@pytest.mark.parametrize("name", sorted(PARSERS))
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 500, 1000, 5000, 100_000])
def test_deep_nesting_is_an_invalid_json_attempt(name, depth):
    parsed = _answers(PARSERS[name], WRAP[name](_deep_call(depth)))
    assert [a.error for a in parsed.calls] == [ToolErrorKind.INVALID_JSON]
    assert "nests deeper than" in parsed.calls[0].message


@pytest.mark.parametrize("name", sorted(ENV_FORMATS))
@pytest.mark.parametrize("depth", [500, 1000, 20_000])
def test_env_step_answers_a_deeply_nested_call_with_an_error_observation(name, depth):
    env = gym.make("agentgym/ToolCall-v0", families=["calculator"], **ENV_FORMATS[name])
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step(WRAP[name](_deep_call(depth)))
    assert not terminated and info["tool_errors"] == {"invalid_json": 1}
    assert obs[0]["content"].removeprefix("Observation: ").startswith("Error: ")


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_nesting_within_the_limit_still_parses(name):  # wrappers add up to 5 levels
    parsed = _answers(PARSERS[name], WRAP[name](_deep_call(MAX_JSON_DEPTH - 8)))
    assert parsed.calls[0].call is not None


JSONISH = st.text(alphabet='{}[]":,0123456789.eE+-tfnrulsa \n\\<>/_', max_size=200)
FRAGMENTS = st.sampled_from(
    [
        "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "Action:",
        "Action Input:", "Final Answer:", "\\boxed{", "}", '{"name": "calculator"',
        '"arguments": ', '"parameters": ', "NaN", "1e999", "\ud800", "\x00", "```json\n",
        '"\\u003c', ";", "[[[[[[[[", "]]]]]]]]",
    ]
)  # fmt: skip
ADVERSARIAL = st.lists(st.one_of(FRAGMENTS, JSONISH, st.text(max_size=50)), max_size=30).map(
    "".join
)


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(st.text(), ADVERSARIAL), truncated=st.booleans())
def test_any_text_parses_to_attempts(name, text, truncated):
    _answers(PARSERS[name], text, truncated)


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(max_examples=60, deadline=None)
@given(depth=st.integers(1, 3000), body=st.sampled_from(["[", '{"a": ', '[{"b": ']))
def test_any_depth_of_any_opener_parses_to_attempts(name, depth, body):
    _answers(PARSERS[name], WRAP[name](body * depth))


@pytest.mark.parametrize("name", sorted(ENV_FORMATS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=ADVERSARIAL, truncated=st.booleans())
def test_env_step_answers_any_text(name, text, truncated):
    env = gym.make("agentgym/ToolCall-v0", families=["calculator"], **ENV_FORMATS[name])
    env.reset(seed=0)
    obs, reward, terminated, truncated_out, info = env.step(
        Completion(text, "length" if truncated else "stop")
    )
    assert isinstance(reward, float)
    assert terminated == (info["tool_calls"] == 0)
    if terminated:
        assert obs == []
    else:  # every call is answered: a tool message each, or one ReAct observation
        assert len(obs) == (1 if name == "react" else info["tool_calls"])
        assert all(isinstance(m["content"], str) and m["content"] for m in obs)
    env.close()
