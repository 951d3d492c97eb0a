"""Function-calling data in Tasks-v0: rows with their own tools, judged by their expected calls.

The 6-row file is the one the docs show (`docs/function_calls.jsonl`): a simple call, a
choice, a parallel pair, a no-call row, loose types, acceptable-value lists.
"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import agentgym  # noqa: F401  (registers agentgym/Tasks-v0)
from agentgym import cli
from agentgym.env.checker import check_agent_env
from agentgym.envs.tasks.data import DataError
from agentgym.envs.tasks.env import TableCallsEnv
from agentgym.tools import tool

DOCS_FILE = Path(__file__).resolve().parent.parent / "docs" / "function_calls.jsonl"
COLUMNS = {
    "prompt_column": "query",
    "tools_column": "tools",
    "expected_calls_column": "answers",
    "category_column": "category",
}
BEST = 1.0 + 0.5 * 1.0 + 0.1 * 0.3  # correctness + 0.5 x tool + 0.1 x format


def make(data=DOCS_FILE, **options) -> TableCallsEnv:
    env = gym.make(
        "agentgym/Tasks-v0",
        data=str(data) if isinstance(data, Path) else data,
        **{**COLUMNS, **options},
    )
    assert isinstance(env.unwrapped, TableCallsEnv)
    return env


def rows() -> list[dict]:
    return [json.loads(line) for line in DOCS_FILE.read_text().splitlines()]


def all_ids(env) -> list[str]:
    table = env.unwrapped.table
    return [*table.ids["train"], *table.ids["test"]]


def test_every_docs_row_scores_its_demonstration_in_full_in_one_turn():
    env = make()
    categories = set()
    for task_id in all_ids(env):
        obs, info = env.reset(options={"task_id": task_id})
        categories.add(info["category"])
        offered = [t["function"]["name"] for t in info["tools"]]
        assert offered == [
            (t.get("function") or t)["name"]
            for t in json.loads(json.dumps(_row(task_id)["tools"]))
            if isinstance(t, dict)
        ] or isinstance(_row(task_id)["tools"], str)
        (reply,) = env.unwrapped.demonstration(env.unwrapped.task)
        _, reward, terminated, truncated, step_info = env.step(reply)
        assert (terminated, truncated) == (True, False)  # judge-only: one turn
        assert reward == pytest.approx(BEST), (task_id, step_info["reward_parts"])
        assert step_info["correct"] is True
    assert categories == {"simple", "multiple", "parallel", "irrelevance", "nested"}


def _row(task_id: str) -> dict:
    return rows()[int(task_id.split("/")[1])]


def test_loose_types_reach_the_model_as_strict_json_schema():
    env = make()
    _, info = env.reset(options={"task_id": _id_of(env, "maps.route")})
    (route,) = info["tools"]
    params = route["function"]["parameters"]
    assert params["type"] == "object"
    assert params["properties"]["stops"]["type"] == "array"  # was "tuple"
    assert "type" not in params["properties"]["note"]  # was "any"
    assert params["properties"]["options"]["type"] == "object"  # was "dict"


def _id_of(env, function: str) -> str:
    for task_id in all_ids(env):
        schemas = env.unwrapped.load_task(task_id).metadata["schemas"]
        if any(s["name"] == function for s in schemas):
            return task_id
    raise AssertionError(function)


def test_a_wrong_reply_a_no_call_reply_and_a_call_on_the_no_call_row():
    env = make()
    env.reset(options={"task_id": _id_of(env, "book_table")})
    call = (
        '<tool_call>\n{"name": "book_table", "arguments": {"restaurant": "chez marie", '
        '"people": 4, "time": "7:30 pm"}}\n</tool_call>'
    )
    _, reward, *_, info = env.step(call)  # acceptable values: another listed spelling
    assert info["reward_parts"] == {"correctness": 1.0, "tool": 1.0, "format": 0.3}
    env.reset(options={"task_id": _id_of(env, "book_table")})
    _, reward, *_, info = env.step(call.replace("4", "5"))
    assert info["reward_parts"] == {"correctness": 0.0, "tool": 0.5, "format": 0.3}
    env.reset(options={"task_id": _id_of(env, "book_table")})
    _, reward, *_, info = env.step("I would rather not.")
    assert info["reward_parts"] == {"correctness": 0.0, "tool": -1.0, "format": 0.3}
    irrelevant = next(t for t in all_ids(env) if _row(t)["answers"] == [])
    env.reset(options={"task_id": irrelevant})
    _, reward, *_, info = env.step(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "x"}}\n</tool_call>'
    )
    assert info["reward_parts"] == {"correctness": 0.0, "tool": 0.0, "format": 0.3}
    env.reset(options={"task_id": irrelevant})
    _, reward, *_, info = env.step('<tool_call>\n{"name": "get_weather", "arguments": {')
    assert info["reward_parts"]["format"] == -0.2  # a malformed call costs the format part


def test_normalized_strings_and_the_toolrl_reward_are_options():
    env = make(string_match="normalized", call_reward="toolrl")
    env.reset(options={"task_id": _id_of(env, "get_weather")})
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": " paris. "}}\n</tool_call>'
    _, _, *_, info = env.step(call)
    assert info["reward_parts"] == {"correctness": 1.0, "tool": 1.0, "format": 0.3}
    strict = make()
    strict.reset(options={"task_id": _id_of(strict, "get_weather")})
    _, _, *_, info = strict.step(call)
    assert info["reward_parts"]["correctness"] == 0.0


def test_the_env_passes_both_checkers():
    env = make()
    check_env(env.unwrapped, skip_render_check=True)
    check_agent_env(env.unwrapped)


def test_malformed_rows_are_refused_by_line_before_anything_runs(tmp_path):
    lines = DOCS_FILE.read_text().splitlines()[:3]
    lines.append(
        json.dumps(
            {
                "query": "Weather in Oslo?",
                "tools": ["get_weather", {"name": "x"}],
                "answers": [],
                "category": "simple",
            }
        )
    )
    lines.append(
        json.dumps(
            {
                "query": "Weather in Rome?",
                "tools": [{"name": "get_weather", "parameters": {"type": "dict"}}],
                "answers": [{"get_forecast": {"city": ["Rome"]}}],
            }
        )
    )
    lines.append(
        json.dumps(
            {"query": "Pay me", "tools": [{"name": "pay", "parameters": "x"}], "answers": []}
        )
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as caught:
        make(bad)
    text = str(caught.value)
    assert "3 problems" in text
    assert "line 4, column 'tools': tool 0 is a str; valid: a list of function schemas" in text
    assert (
        "line 5, column 'answers': expected call 'get_forecast' names a function the row "
        "does not offer (get_weather)" in text
    )
    assert "line 6, column 'tools': tool 0: tool 'pay': parameters must be a JSON schema" in text


def test_rows_with_schemas_need_expected_calls_and_judge_options_need_schemas():
    with pytest.raises(DataError, match="also give expected_calls_column"):
        gym.make(
            "agentgym/Tasks-v0", data=str(DOCS_FILE), prompt_column="query", tools_column="tools"
        )
    with pytest.raises(ValueError, match="apply to rows with their own function schemas"):
        gym.make(
            "agentgym/Tasks-v0",
            data=[{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": 2}],
            call_reward="toolrl",
        )
    with pytest.raises(ValueError, match="call_reward='best'; valid: seed, toolrl"):
        make(call_reward="best")


@tool
def get_weather(city: str, unit: str = "celsius") -> str:
    """The weather in a city.

    Args:
        city: The city.
        unit: celsius or fahrenheit.
    """
    return f"sunny in {city}, 21 {unit}"


def test_with_callables_the_calls_run_and_the_episode_goes_on():
    data = [r for r in rows() if r["category"] in ("simple", "irrelevance")]
    env = make(data, tools=[get_weather], split_column=None)
    simple = next(
        t for t in all_ids(env) if env.unwrapped.load_task(t).metadata["category"] == "simple"
    )
    env.reset(options={"task_id": simple})
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    obs, reward, terminated, truncated, info = env.step(call)
    assert not terminated and "sunny in Paris, 21 celsius" in obs[-1]["content"]
    obs, reward, terminated, truncated, info = env.step("It is sunny, 21 degrees.")
    assert terminated and info["episode_parts"] == {"correctness": 1.0, "tool": 1.0, "format": 0.3}


def test_the_docs_file_trains_two_steps_and_evaluates_per_category(tmp_path):
    settings = [f"run.env_kwargs.{k}={v}" for k, v in COLUMNS.items()]
    settings.append(f"run.env_kwargs.data={DOCS_FILE}")
    small = ["grpo.group_size=2", "grpo.tasks_per_step=2", "sampling.max_new_tokens=12"]
    flags = [x for s in [*settings, *small] for x in ("--set", s)]
    out = tmp_path / "run"
    code = cli.main(
        [
            "train",
            "--env",
            "agentgym/Tasks-v0",
            "--model",
            "tiny-random",
            "--steps",
            "2",
            "--output",
            str(out),
            *flags,
        ]
    )
    assert code == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "reward/mean" in m] == [1, 2]
    report_dir = tmp_path / "eval"
    code = cli.main(
        [
            "eval",
            "--env",
            "agentgym/Tasks-v0",
            "--model",
            str(out / "checkpoint-000002"),
            "--split",
            "train",
            "--tasks",
            "5",
            "--output",
            str(report_dir),
            *flags,
        ]
    )
    assert code == 0
    report = json.loads((report_dir / "report.json").read_text())
    names = set(report["models"])
    assert {
        "model / simple",
        "model / parallel",
        "model / irrelevance",
        "model / nested",
    } <= names, names
    per_task = report["tasks"]["model"]
    assert {t["category"] for t in per_task} >= {"simple", "parallel"}


@pytest.mark.parametrize("tool_format", ["hermes", "react"])
def test_the_demonstrations_score_in_full_in_each_text_format(tool_format):
    env = make(tool_format=tool_format)
    for task_id in all_ids(env):
        obs, _ = env.reset(options={"task_id": task_id})
        for name in (s["name"] for s in env.unwrapped.task.metadata["schemas"]):
            assert name in obs[0]["content"]  # the text formats list the row's own tools
        (reply,) = env.unwrapped.demonstration(env.unwrapped.task)
        _, reward, *_, info = env.step(reply)
        assert reward == pytest.approx(BEST), (tool_format, task_id, reply)
