"""`run.curriculum`: the level rises when a window of train correctness reaches the
threshold and not otherwise, the envs serve the level a reset names, and a resumed run
goes on at the level (and window) it stopped at."""

from __future__ import annotations

import json
import math

import cli_envs  # noqa: F401  (registers cli_envs/Levels-v0)
import gymnasium as gym
import pytest
from test_resume import _split_run, _weights

import agentgym  # noqa: F401  (registers the built-in environments)
from agentgym.cli import main
from agentgym.config import ConfigError, CurriculumConfig, load_config
from agentgym.env.mixture import EnvMix
from agentgym.run import preflight
from agentgym.run.curriculum import Curriculum


def _levels_seen(series, levels=(1, 2, 3), threshold=0.8, window=3):
    """The level each step of `series` trained at, and the curriculum after them."""
    c = Curriculum(tuple(levels), threshold, window)
    seen = []
    for correctness in series:
        seen.append(c.level)
        c.update(correctness)
    return seen, c


def test_the_level_rises_when_the_windows_mean_reaches_the_threshold():
    # window 3: after step 3 the mean is (0.9 + 0.9 + 0.6) / 3 = 0.8 >= 0.8: step 4 is at 2
    seen, c = _levels_seen([0.9, 0.9, 0.6, 0.0, 1.0, 1.0, 0.4])
    assert seen == [1, 1, 1, 2, 2, 2, 2]
    # level 2's window starts empty: [0.0, 1.0, 1.0] = 0.667 < 0.8, then [1, 1, 0.4] = 0.8
    assert (c.level, c.recent) == (3, [])


def test_the_level_stays_below_the_threshold_and_before_the_window_fills():
    seen, c = _levels_seen([0.79] * 50)
    assert seen == [1] * 50 and c.recent == [0.79] * 3
    seen, _ = _levels_seen([1.0, 1.0], window=3)  # a full window is needed
    assert seen == [1, 1]


def test_the_window_slides_and_a_step_without_correctness_is_left_out():
    # window 2: [0.0, 1.0] = 0.5, then [1.0, 1.0] = 1.0 rises; NaN steps change nothing
    seen, c = _levels_seen([0.0, math.nan, 1.0, math.nan, 1.0, 0.0], window=2, threshold=0.9)
    assert seen == [1, 1, 1, 1, 1, 2]
    assert c.recent == [0.0]


def test_the_last_level_is_kept():
    seen, c = _levels_seen([1.0] * 6, levels=(2, 4), window=1)
    assert seen == [2, 4, 4, 4, 4, 4] and c.stage == 1


def test_replaying_the_logged_history_is_the_live_state_and_refuses_another_curriculum():
    series = [0.9, 0.9, 0.6, 0.0, 1.0]
    seen, live = _levels_seen(series)
    history = [
        {"step": i + 1, "curriculum/level": level, "correctness_rate": x}
        for i, (level, x) in enumerate(zip(seen, series, strict=True))
    ]
    replayed = Curriculum((1, 2, 3), 0.8, 3).replay(history)
    assert (replayed.stage, replayed.recent) == (live.stage, live.recent) == (1, [0.0, 1.0])
    with pytest.raises(ConfigError, match="step 4 trained at curriculum level 2.*puts it at 1"):
        Curriculum((1, 2, 3), 0.95, 3).replay(history)
    # a step without correctness is NaN in memory and null in JSON: both are left out
    gaps = [{"step": 1, "curriculum/level": 1, "correctness_rate": None}, history[0]]
    assert Curriculum((1, 2), 0.8, 1).replay(gaps).level == 2


def test_no_levels_is_no_curriculum():
    assert Curriculum.from_config(CurriculumConfig()) is None
    made = Curriculum.from_config(CurriculumConfig(levels=[1, 3], threshold=0.5, window=2))
    assert made == Curriculum((1, 3), 0.5, 2)


# -- the envs serve the level a reset names ---------------------------------------------


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("agentgym/ToolCall-v0", {"tool_format": "hermes"}),
        ("agentgym/Math-v0", {"generators": ["chain_sum", "products"]}),
    ],
)
def test_a_reset_at_a_level_is_the_env_made_at_that_level(env_id, kwargs):
    base, level3 = gym.make(env_id, **kwargs), gym.make(env_id, **kwargs, difficulty=3)
    try:
        assert base.unwrapped.difficulty_levels == 5
        for seed in range(4):
            at3 = base.reset(seed=seed, options={"difficulty": 3})
            assert at3 == level3.reset(seed=seed)
            assert base.reset(seed=seed) == gym.make(env_id, **kwargs).reset(seed=seed)
            assert base.reset(seed=seed) != at3  # no option: back at the env's own level
    finally:
        base.close()
        level3.close()


def test_an_env_without_levels_refuses_the_option(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+2?", "answer": "4"}\n')
    env = gym.make("agentgym/Tasks-v0", data=str(data))
    with pytest.raises(ValueError, match="difficulty=2: TasksEnv has no difficulty levels"):
        env.reset(seed=0, options={"difficulty": 2})
    with pytest.raises(ValueError, match="unknown reset option.*valid: split, task_id, difficulty"):
        env.reset(seed=0, options={"level": 2})
    env.close()


def test_a_mix_has_levels_only_when_every_member_has_them():
    both = EnvMix([{"env": "math"}, {"env": "tool_call"}])
    with_digits = EnvMix([{"env": "math"}, {"env": "cli_envs:cli_envs/Digits-v0"}])
    assert (both.difficulty_levels, with_digits.difficulty_levels) == (5, 1)
    _, info = both.reset(seed=7, options={"difficulty": 2})
    member = both.current.agent
    assert member.difficulty == 2 and info["task_id"].startswith(both.current.name)
    both.close()
    with_digits.close()


@pytest.mark.parametrize(
    ("env", "levels", "says"),
    [
        ("cli_envs:cli_envs/Digits-v0", [1, 2], "has no difficulty levels"),
        ("tool_call", [2, 2], r"\[2, 2\]; valid: levels rising strictly from 1 to 5"),
        ("tool_call", [1, 6], "valid: levels rising strictly from 1 to 5"),
        ("cli_envs:cli_envs/Levels-v0", [0, 1], "from 1 to 3"),
    ],
)
def test_preflight_refuses_levels_the_env_cannot_serve(env, levels, says):
    overrides = {"run.env": env, "run.curriculum": {"levels": levels}, "eval.tasks": 4}
    config = load_config(overrides=overrides)
    with pytest.raises(ConfigError, match=rf"run.curriculum.levels: .*{says}"):
        preflight.check(config, "train")
    preflight.check(config, "eval")  # eval plays the env's own level: no curriculum


def test_the_cli_sets_the_curriculum():
    from agentgym.config_cli import parse_overrides

    overrides = parse_overrides(["run.curriculum.levels=[1, 2]", "run.curriculum.window=3"])
    config = load_config(overrides={"run.curriculum": overrides["run"]["curriculum"]})
    assert config.run.curriculum == CurriculumConfig(levels=[1, 2], window=3)


# -- a run: the levels it trains at, and an exact resume -------------------------------

CLIMB = [
    "train", "--env", "cli_envs:cli_envs/Levels-v0", "--model", "tiny-random",
    "--set", "run.curriculum.levels=[1, 2, 3]", "--set", "run.curriculum.threshold=0.5",
    "--set", "run.curriculum.window=2", "--set", "grpo.group_size=2",
    "--set", "grpo.tasks_per_step=2", "--set", "sampling.max_new_tokens=8",
    "--set", "run.report_to=[]", "--set", "run.save_every=1", "--set", "optim.lr=5e-3",
    "--set", "run.log_completions=4", "--steps", "5",
]  # fmt: skip


def _rows(run):
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if "second" not in k} for r in rows]


@pytest.fixture(scope="module")
def climbed(tmp_path_factory):
    run = tmp_path_factory.mktemp("climb") / "run"
    assert main([*CLIMB, "--output", str(run)]) == 0
    return run


def test_a_run_climbs_to_level_2_and_stays_where_correctness_is_0(climbed):
    rows = _rows(climbed)
    # level 1: every reply correct, so the 2-step window reaches 0.5 after step 2;
    # level 2: no reply correct, so the run stays there (level 3 never comes)
    assert [r["curriculum/level"] for r in rows] == [1, 1, 2, 2, 2]
    assert [r["correctness_rate"] for r in rows] == [1.0, 1.0, 0.0, 0.0, 0.0]
    played = [json.loads(x) for x in (climbed / "completions.jsonl").read_text().splitlines()]
    levels = {(c["step"], c["task_id"][:2]) for c in played}
    assert levels == {(1, "L1"), (2, "L1"), (3, "L2"), (4, "L2"), (5, "L2")}


@pytest.mark.parametrize("at", [2, 3])  # right at the rise, and inside level 2's window
def test_a_resumed_curriculum_goes_on_at_its_level(climbed, tmp_path, monkeypatch, at):
    split = tmp_path / "split"
    _split_run(monkeypatch, split, CLIMB, at=at)
    assert _rows(split) == _rows(climbed)
    assert _weights(split / "checkpoint-000005") == _weights(climbed / "checkpoint-000005")
