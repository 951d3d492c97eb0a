"""Several environments in one run (`run.envs`, `agentgym/Mix-v0`): tasks drawn by weight from
the run's seeded stream, a group's G episodes from one env, per-env metrics and closing-table
rows, and a resumed mixed run bitwise the uninterrupted one."""

from __future__ import annotations

import json
from collections import Counter

import cli_envs  # noqa: F401  (registers cli_envs/Digits-v0, a custom env)
import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from test_resume import _split_run, _weights

import agentgym  # noqa: F401  (registers the built-in environments)
from agentgym.cli import main
from agentgym.config import Config, ConfigError, load_config
from agentgym.env.checker import check_agent_env
from agentgym.env.mixture import EnvMix

THREE = [
    {"env": "math", "weight": 1},
    {"env": "tool_call", "weight": 2, "env_kwargs": {"families": ["calculator"]}},
    {"env": "cli_envs:cli_envs/Digits-v0", "weight": 1, "name": "digits"},
]


@pytest.fixture(scope="module")
def mix():
    env = gym.make("agentgym/Mix-v0", envs=THREE)
    yield env
    env.close()


def test_the_mix_passes_gymnasiums_checker_and_ours(mix):
    check_env(mix.unwrapped, skip_render_check=True)
    check_agent_env(mix)


def test_weights_are_respected_over_a_long_seeded_draw(mix):
    seeds = np.random.default_rng(0).integers(0, 2**31 - 1, size=4000)
    counts = Counter(mix.reset(seed=int(s))[1]["env"] for s in seeds)
    expected = {"math": 1000.0, "tool_call": 2000.0, "digits": 1000.0}
    chi2 = sum((counts[k] - e) ** 2 / e for k, e in expected.items())
    assert set(counts) == set(expected)
    assert chi2 < 13.82  # chi-square, 2 degrees of freedom, p = 0.001


def test_a_seed_picks_one_env_and_task_for_the_whole_group(mix):
    for seed in range(20):
        first = mix.reset(seed=seed)
        again = mix.reset(seed=seed)
        assert first == again and first[1]["task_id"].startswith(f"{first[1]['env']}:")


def test_task_ids_name_the_member_and_reset_to_that_task(mix):
    _, info = mix.reset(seed=3)
    obs, again = mix.reset(options={"task_id": info["task_id"]})
    assert again["task_id"] == info["task_id"] and again["env"] == info["env"]
    with pytest.raises(KeyError, match="names no member of this mix.*math, tool_call, digits"):
        mix.reset(options={"task_id": "chess:1"})


def test_the_test_split_interleaves_the_members(mix):
    agent = mix.unwrapped
    ids = [agent.task_id("test", i) for i in range(6)]
    assert [i.split(":")[0] for i in ids] == ["math", "tool_call", "digits"] * 2
    assert agent.num_tasks("test") == sum(m.agent.num_tasks("test") for m in agent.members)


@pytest.mark.parametrize(
    ("envs", "says"),
    [
        ([], "non-empty list"),
        ([{"env": "math", "weight": 0}], r"envs\[0\].weight=0; valid: a number > 0"),
        ([{"env": "math", "wieght": 1}], r"envs\[0\] has unknown key\(s\) \['wieght'\]"),
        ([{"env": "math"}, {"env": "math"}], r"envs\[1\]: name 'math' is taken"),
        ([{"weight": 1}], r"envs\[0\] must be a mapping with an 'env' key"),
    ],
)
def test_bad_entries_name_the_entry_and_field(envs, says):
    with pytest.raises(ValueError, match=says):
        EnvMix(envs)


def test_run_envs_sets_the_mix_and_refuses_a_second_env():
    config = load_config(overrides={"run.envs": THREE})
    assert (config.run.env, config.run.env_kwargs) == ("agentgym/Mix-v0", {"envs": THREE})
    assert Config.model_validate(config.model_dump()).run == config.run  # a checkpoint's config
    with pytest.raises(ConfigError, match="set run.envs or run.env"):
        load_config(overrides={"run.env": "code", "run.envs": THREE})


MIXED = [
    "train", "--model", "tiny-random", "--set", f"run.envs={json.dumps(THREE)}",
    "--set", "grpo.group_size=2", "--set", "grpo.tasks_per_step=4",
    "--set", "sampling.max_new_tokens=12", "--set", "run.report_to=[]",
    "--set", "lora.enabled=true", "--set", "lora.r=4", "--set", "optim.lr=5e-3",
    "--set", "run.save_every=1", "--set", "eval.every=3", "--set", "eval.tasks=3",
    "--set", "eval.report_tasks=3", "--set", "eval.n=2", "--set", "eval.max_new_tokens=12",
]  # fmt: skip


def _rows(run):
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if not k.endswith(("_seconds", "per_second"))} for r in rows
    ]


def test_a_mixed_run_logs_each_env_and_resumes_exactly(tmp_path, monkeypatch):
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert main([*MIXED, "--steps", "3", "--output", str(whole)]) == 0
    rows = _rows(whole)
    played = {k.split("/")[1] for r in rows for k in r if k.endswith("/correctness_rate")
              and k.startswith("env/")}  # fmt: skip
    assert played == {"math", "tool_call", "digits"}
    report = json.loads((whole / "report" / "report.json").read_text())
    # step 3 or the start (step 0), whichever scored higher on the selection tasks
    best = next(m for m in report["models"] if m.startswith("best@") and "(" not in m)
    assert best in ("best@0", "best@3")
    assert {"start (math)", f"{best} (tool_call)", f"{best} (digits)"} <= set(report["models"])
    assert f"{best} - start (math)" in report["comparisons"]
    _split_run(monkeypatch, split, [*MIXED, "--steps", "3"], at=2)
    assert _rows(split) == rows
    assert _weights(split / "checkpoint-000003") == _weights(whole / "checkpoint-000003")
