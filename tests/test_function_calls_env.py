"""agentgym/FunctionCalls-v0: the generated world served as a gymnasium env, judged by its calls.

The generator itself (`envs/function_calls/world.py`) has its own tests in
`tests/test_function_calls_world.py`; these check the env around it.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import agentgym
from agentgym import cli
from agentgym.envs.function_calls.env import FunctionCallsWorldEnv

BEST = 1.0 + 0.5 * 1.0 + 0.1 * 0.3


def make(**kwargs) -> FunctionCallsWorldEnv:
    env = gym.make("agentgym/FunctionCalls-v0", **kwargs)
    return env


def test_the_short_name_and_the_ids():
    assert agentgym.SHORT_NAMES["function_calls"] == "agentgym/FunctionCalls-v0"
    env = make(difficulty=[1, 3]).unwrapped
    assert [env.task_id("train", i) for i in range(4)] == [
        "level1/train/0",
        "level3/train/0",
        "level1/train/1",
        "level3/train/1",
    ]
    assert env.load_task("level3/test/2").metadata["level"] == 3


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_every_levels_demonstrations_score_in_full_in_one_turn(level):
    env = make(difficulty=level)
    u = env.unwrapped
    for split in ("train", "test"):
        for index in range(12):
            env.reset(options={"task_id": u.task_id(split, index)})
            (reply,) = u.demonstration(u.task)
            _, reward, terminated, truncated, info = env.step(reply)
            assert (terminated, truncated) == (True, False)
            assert reward == pytest.approx(BEST), (u.task.task_id, info["reward_parts"])


def test_train_and_test_share_no_api_family_and_no_offered_function():
    env = make(difficulty=[1, 2, 3, 4, 5]).unwrapped
    apis, functions = {}, {}
    for split in ("train", "test"):
        tasks = [env.load_task(env.task_id(split, i)) for i in range(150)]
        apis[split] = {t.metadata["api"] for t in tasks}
        functions[split] = {s["name"] for t in tasks for s in t.metadata["schemas"]}
    assert apis["train"] and apis["test"] and not apis["train"] & apis["test"]
    assert not functions["train"] & functions["test"]


def test_level_4_holds_no_call_rows_whose_right_answer_is_a_plain_reply():
    env = make(difficulty=4)
    u = env.unwrapped
    irrelevant = [
        u.task_id("test", i)
        for i in range(30)
        if u.load_task(u.task_id("test", i)).metadata["call_specs"] == ()
    ]
    assert irrelevant
    env.reset(options={"task_id": irrelevant[0]})
    _, _, _, _, info = env.step("None of these functions can do that.")
    assert info["reward_parts"] == {"correctness": 1.0, "tool": 1.0, "format": 0.3}
    assert info["category"] == "irrelevance"


def test_a_curriculum_picks_the_level_per_reset():
    env = make(difficulty=1)
    _, info = env.reset(seed=3, options={"difficulty": 5})
    assert env.unwrapped.task.task_id.startswith("level5/")
    env.reset(seed=3)
    assert env.unwrapped.task.task_id.startswith("level1/")


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"difficulty": 6}, "difficulty=6; valid: an int from 1 to 5"),
        ({"difficulty": []}, "or a list of distinct ones"),
        ({"difficulty": [2, 2]}, "or a list of distinct ones"),
        ({"seed": -1}, "seed=-1"),
        ({"call_reward": "best"}, "call_reward='best'; valid: seed, toolrl"),
    ],
)
def test_bad_options_are_value_errors_naming_them(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("(", r"\(")):
        make(**kwargs)


def test_an_unknown_task_id_names_the_shape():
    with pytest.raises(KeyError, match="ids read 'level<d>/<split>/<index>'"):
        make().unwrapped.load_task("train/3")


def test_sft_on_level_1_2_demonstrations_then_two_grpo_steps(tmp_path):
    settings = ["run.env_kwargs.difficulty=[1, 2]", "sampling.max_new_tokens=12",
                "sft.steps=2", "sft.batch_size=2", "sft.demonstrations=4"]  # fmt: skip
    flags = [x for s in settings for x in ("--set", s)]
    warm = tmp_path / "warm"
    assert cli.main(["sft", "--env", "function_calls", "--model", "tiny-random",
                     "--output", str(warm), *flags]) == 0  # fmt: skip
    (start,) = sorted(warm.glob("checkpoint-*"))
    run = tmp_path / "grpo"
    grpo = ["--set", "grpo.group_size=2", "--set", "grpo.tasks_per_step=2"]
    assert cli.main(["train", "--env", "function_calls", "--model", str(start), "--steps", "2",
                     "--output", str(run), *flags, *grpo]) == 0  # fmt: skip
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert any(k.startswith("category/") for k in steps[0]), sorted(steps[0])
