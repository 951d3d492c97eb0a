"""ToolEnv: a user-defined tool environment, its episodes, its reward, its validation."""

import datetime
import decimal
import math

import gymnasium as gym
import pytest
from episodes import play

from agentgym.env.core import Task
from agentgym.env.tool_env import (
    DEFAULT_REWARD_WEIGHTS,
    ExpectedCall,
    ToolEnv,
    arguments_equal,
    tool_reward,
)
from agentgym.rewards.verifiable import combine
from agentgym.tools import HERMES, REACT, tool
from agentgym.types import Completion, ToolCall

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima"}
COUNTRIES = {"train": ("France", "Japan"), "test": ("Kenya", "Peru")}


@tool
def capital(country: str) -> str:
    """Looks up the capital city of a country.

    Args:
        country: The country's English name.
    """
    return CAPITALS[country]  # an unknown country raises KeyError: a TOOL_RAISED result


class CapitalsEnv(ToolEnv):
    """A user's environment: one tool, two tasks per split, answers compared as words."""

    default_system_prompt = "Name the capital city."

    def make_tools(self):
        return [capital]

    def num_tasks(self, split):
        return len(COUNTRIES[split])

    def task_id(self, split, index):
        return f"{split}/{index}"

    def load_task(self, task_id):
        split, index = task_id.split("/")
        country = COUNTRIES[split][int(index)]
        expected = (ExpectedCall("capital", {"country": country}),)
        metadata = {"split": split, "expected_calls": expected}
        return Task(task_id, f"What is the capital of {country}?", CAPITALS[country], metadata)

    def is_correct(self, task, answer):
        return answer.strip().lower() == task.answer.lower()


ENV_ID = "tests/Capitals-v0"
if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point=CapitalsEnv, max_episode_steps=3)

BEST = 1.0 + 0.5 * 1.0 + 0.1 * 0.3  # correct, every expected call matched, well formed


def _call(country, fmt=HERMES):
    return fmt.render_call(ToolCall("capital", {"country": country}))


@pytest.fixture
def env():
    made = gym.make(ENV_ID)
    made.reset(options={"task_id": "train/0"})  # France
    return made


def test_a_user_env_works_through_gym_make(env):
    obs, info = env.reset(seed=3)
    assert [m["role"] for m in obs] == ["system", "user"]
    assert obs[0]["content"].startswith("Name the capital city.")
    assert "<tools>" in obs[0]["content"] and '"capital"' in obs[0]["content"]
    assert [t["function"]["name"] for t in info["tools"]] == ["capital"]
    country = obs[1]["content"].removeprefix("What is the capital of ").rstrip("?")
    obs, reward, terminated, truncated, info = env.step(_call(country))
    assert obs == [{"role": "tool", "content": CAPITALS[country], "name": "capital"}]
    assert not terminated and not truncated
    assert info["tool_calls"] == 1 and info["tool_errors"] == {}
    obs, reward, terminated, truncated, info = env.step(f"\\boxed{{{CAPITALS[country]}}}")
    assert terminated and not truncated and obs == []
    assert info["correct"] and info["final_answer"] == CAPITALS[country]
    assert info["expected_answer"] == CAPITALS[country]
    assert info["episode_parts"] == {"correctness": 1.0, "tool": 1.0, "format": 0.3}


@pytest.mark.parametrize("fmt", [HERMES, REACT], ids=["hermes", "react"])
def test_step_rewards_sum_to_the_episode_score(fmt):
    env = CapitalsEnv(tool_format=fmt.name)
    env.reset(options={"task_id": "test/1"})
    final = "\\boxed{Lima}" if fmt is HERMES else "Thought: I know it.\nFinal Answer: Lima"
    total, parts, (*_, info) = play(env, [_call("Peru", fmt), final])
    assert parts == pytest.approx(info["episode_parts"])
    assert total == pytest.approx(BEST)
    assert total == pytest.approx(combine(info["episode_parts"], DEFAULT_REWARD_WEIGHTS))


def test_a_wrong_answer_with_perfect_calls_and_format_scores_below_any_correct_one(env):
    wrong, _, _ = play(env, [_call("France"), "\\boxed{Lyon}"])
    assert wrong == pytest.approx(0.5 + 0.03)
    env.reset(options={"task_id": "train/0"})
    # correct, but the only call went to a tool that does not exist, and one turn was garbled
    bad_call = HERMES.render_call(ToolCall("atlas", {"country": "France"}))
    correct, parts, _ = play(env, [bad_call, "<tool_call>{oops</tool_call>", "\\boxed{Paris}"])
    assert parts == pytest.approx({"correctness": 1.0, "tool": 0.0, "format": -0.2})
    assert correct == pytest.approx(1.0 - 0.02)
    assert wrong < correct


def test_no_tool_call_at_all_gives_the_tool_part_minus_one(env):
    total, parts, (_, _, terminated, _, info) = play(env, ["\\boxed{Paris}"])
    assert terminated and info["correct"]
    assert parts == {"correctness": 1.0, "tool": -1.0, "format": 0.3}
    assert total == pytest.approx(1.0 - 0.5 + 0.03)


def test_a_turn_without_calls_or_answer_ends_the_episode_unanswered(env):
    total, parts, (_, _, terminated, _, info) = play(env, [_call("France"), "It is Paris."])
    assert terminated and info["final_answer"] is None and not info["correct"]
    assert parts == pytest.approx({"correctness": 0.0, "tool": 1.0, "format": -0.2})


def test_calls_win_over_an_answer_in_the_same_turn(env):
    _, _, terminated, _, info = env.step(_call("France") + "\n\\boxed{Paris}")
    assert not terminated and "correct" not in info


@pytest.mark.parametrize(
    ("turn", "kind"),
    [
        ("<tool_call>{not json}</tool_call>", "invalid_json"),
        ('<tool_call>{"arguments": {}}</tool_call>', "missing_name"),
        ('<tool_call>{"name": "capital", "arguments": [1]}</tool_call>', "arguments_not_object"),
        ('<tool_call>{"name": "atlas", "arguments": {}}</tool_call>', "unknown_tool"),
        (
            '<tool_call>{"name": "capital", "arguments": {"country": 7}}</tool_call>',
            "invalid_arguments",
        ),
        (
            '<tool_call>{"name": "capital", "arguments": {"country": "Mars"}}</tool_call>',
            "tool_raised",
        ),
    ],
)
def test_a_bad_call_is_an_error_observation_and_a_count(env, turn, kind):
    obs, reward, terminated, _, info = env.step(turn)
    assert not terminated
    assert info["tool_calls"] == 1 and info["tool_errors"] == {kind: 1}
    assert len(obs) == 1 and obs[0]["content"].startswith("Error: ")


def test_only_calls_that_fail_to_parse_cost_the_format_part(env):
    _, parts, _ = play(env, [_call("Mars"), _call("France"), "\\boxed{Paris}"])
    assert parts["format"] == pytest.approx(0.3)  # a tool that raised is no format error
    env.reset(options={"task_id": "train/0"})
    _, parts, _ = play(env, ["<tool_call>{", _call("France"), "\\boxed{Paris}"])
    assert parts["format"] == pytest.approx(-0.2)


def test_calls_beyond_the_per_turn_limit_are_not_run_and_earn_nothing():
    env = CapitalsEnv(max_calls_per_turn=1)
    env.reset(options={"task_id": "train/0"})
    obs, _, _, _, info = env.step(_call("Japan") + _call("France"))
    assert info["tool_calls"] == 2 and info["tool_errors"] == {"too_many_calls": 1}
    assert obs[1]["content"].startswith("Error: ")
    assert info["episode_parts"]["tool"] == 0.5  # the right tool, but not the call that ran


def test_a_call_cut_off_by_the_token_limit_counts_as_truncated(env):
    _, _, _, _, info = env.step(Completion('<tool_call>{"name": "capi', finish_reason="length"))
    assert info["tool_errors"] == {"truncated": 1}
    assert info["episode_parts"]["tool"] == -1.0


def test_the_time_limit_truncates_and_the_episode_keeps_its_tool_and_format_parts(env):
    total, parts, (_, _, terminated, truncated, info) = play(env, [_call("France")] * 3)
    assert truncated and not terminated
    assert parts == pytest.approx({"correctness": 0.0, "tool": 1.0, "format": -0.2})
    assert total == pytest.approx(0.5 - 0.02)


def test_max_turns_ends_an_unwrapped_episode_with_truncated():
    env = CapitalsEnv(max_turns=2)
    env.reset(options={"task_id": "train/1"})
    _, _, _, truncated, _ = env.step(_call("Japan"))
    assert not truncated
    _, _, terminated, truncated, info = env.step(_call("Japan"))
    assert truncated and not terminated
    assert info["final_answer"] is None and not info["correct"]
    assert info["episode_parts"] == {"correctness": 0.0, "tool": 1.0, "format": -0.2}
    with pytest.raises(RuntimeError):
        env.step("\\boxed{Tokyo}")


def test_reward_weights_scale_the_parts():
    env = CapitalsEnv(reward_weights={"correctness": 2.0})
    env.reset(options={"task_id": "train/0"})
    total, parts, _ = play(env, [_call("France"), "\\boxed{Paris}"])
    assert total == pytest.approx(2.0)
    assert parts == pytest.approx({"correctness": 1.0, "tool": 1.0, "format": 0.3})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reward_weights": {"corectness": 1.0}}, "'corectness'.*correctness, tool, format"),
        ({"reward_weights": {"tool": math.nan}}, "finite"),
        ({"tool_format": "xml"}, "hermes, react"),
        ({"max_turns": 0}, "max_turns"),
        ({"max_calls_per_turn": 0}, "max_calls_per_turn"),
    ],
)
def test_bad_options_raise_value_errors_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CapitalsEnv(**kwargs)


def test_tool_reward_follows_the_tutorial_generalised():
    sql = ExpectedCall("sql", {"query": "SELECT 1"})
    calc = ExpectedCall("calc", {"x": 1})
    assert tool_reward([sql], []) == -1.0
    assert tool_reward([sql], [ToolCall("other", {})]) == 0.0
    assert tool_reward([sql], [ToolCall("sql", {"query": "SELECT 2"})]) == 0.5
    assert tool_reward([sql], [ToolCall("sql", {"query": "SELECT 1"})]) == 1.0
    assert tool_reward([sql, calc], [ToolCall("calc", {"x": 1.0})]) == 0.5
    assert tool_reward([sql, calc], [ToolCall("calc", {"x": 1}), ToolCall("sql", {})]) == 0.75
    assert tool_reward([], [ToolCall("calc", {})]) == 0.0


def test_a_custom_matcher_judges_the_arguments():
    loose = ExpectedCall("f", {"q": "Paris"}, match=lambda e, a: str(a.get("q")).lower() == "paris")
    assert loose.matches(ToolCall("f", {"q": "PARIS"}))
    assert not loose.matches(ToolCall("g", {"q": "paris"}))
    assert arguments_equal({"a": [1, 2], "b": 1}, {"b": 1.0, "a": (1, 2)})


def test_expected_arguments_json_cannot_hold_match_their_text_and_never_raise():
    """A task's expected arguments may hold a date or a Decimal; the model's, parsed from
    JSON, hold text: they match where the text is the value's, and differ otherwise."""
    expected = {"day": datetime.date(2026, 12, 5), "price": decimal.Decimal("9.50")}
    assert arguments_equal(expected, {"price": "9.50", "day": "2026-12-05"})
    assert not arguments_equal(expected, {"price": "9.5", "day": "2026-12-05"})
    assert ExpectedCall("book", expected).matches(
        ToolCall("book", {"day": "2026-12-05", "price": "9.50"})
    )
