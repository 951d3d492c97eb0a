"""verifiers environments (docs/ecosystem.md): `--env verifiers:<module>` loads a verifiers
0.4.0 environment package written here (`tests/verifiers_envs/vf_sums.py`) with the real
library, and plays it with verifiers' own harness (its chat program, run by the subprocess
runtime with uv) through agentgym's endpoint. No mocks; the model is tiny-random."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip(
    "verifiers", reason="verifiers is not installed (pip install 'agentgym[verifiers]')"
)
from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE  # noqa: E402

import agentgym  # noqa: F401, E402  (registers agentgym/Verifiers-v0)
from agentgym.cli import main  # noqa: E402
from agentgym.config import load_config  # noqa: E402
from agentgym.config.files import ConfigError  # noqa: E402
from agentgym.env.core import env_agent_program, make_env  # noqa: E402
from agentgym.envs.verifiers_env.env import VerifiersError, row_ids  # noqa: E402
from agentgym.policy.base import SamplingParams  # noqa: E402
from agentgym.policy.hf import HFPolicy  # noqa: E402
from agentgym.policy.models import load_model_and_tokenizer  # noqa: E402
from agentgym.rollout.player import Submission  # noqa: E402
from agentgym.scale.players import make_player  # noqa: E402
from agentgym.serve.agents import AgentPlayer  # noqa: E402
from agentgym.types import TaskSpec  # noqa: E402

ENVS = Path(__file__).resolve().parent / "verifiers_envs"
ENV = "verifiers:vf_sums"


@pytest.fixture(autouse=True)
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ENVS))


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer("tiny-random")


# --- the taskset as agentgym tasks ----------------------------------------------------------


def test_the_tasksets_rows_are_the_tasks_every_fifth_a_test_task():
    env = make_env(ENV, num_tasks=10).unwrapped
    assert env.splits == {
        "train": ["sum-0", "sum-1", "sum-2", "sum-3", "sum-5", "sum-6", "sum-7", "sum-8"],
        "test": ["sum-4", "sum-9"],
    }
    obs, info = make_env(ENV, num_tasks=10).reset(options={"task_id": "sum-2"})
    assert obs == [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "What is 17 + 11? Reply with the number."},
    ]
    assert info["split"] == "train" and info["tools"] == []
    assert env.load_task("sum-2").answer == "28"


def test_the_same_seed_gives_the_same_task_and_the_splits_are_disjoint():
    env = make_env(ENV)
    first = [env.reset(seed=s)[1]["task_id"] for s in range(6)]
    assert first == [env.reset(seed=s)[1]["task_id"] for s in range(6)]
    tests = {env.reset(seed=s, options={"split": "test"})[1]["task_id"] for s in range(20)}
    assert tests <= {"sum-4", "sum-9"} and not tests & set(first)


def test_a_bad_keyword_argument_is_refused_naming_it_and_the_module():
    with pytest.raises(ValueError, match=r"'vf_sums' refuses .*num_taskz"):
        make_env(ENV, num_taskz=3)
    with pytest.raises(ValueError, match=r"num_tasks"):
        make_env(ENV, num_tasks="many")


def test_a_module_that_is_not_a_verifiers_environment_is_named():
    with pytest.raises(ValueError, match=r"verifiers:json: not a verifiers environment .*Taskset"):
        make_env("verifiers:json")
    with pytest.raises(ValueError, match=r"verifiers:no_such_env_pkg: .*not found"):
        make_env("verifiers:no_such_env_pkg")


def test_a_split_left_empty_is_refused():
    with pytest.raises(ValueError, match=r"3 task\(s\): its test split is empty"):
        make_env(ENV, num_tasks=3)


def test_the_env_is_not_stepped_turn_by_turn():
    env = make_env(ENV)
    env.reset(seed=0)
    with pytest.raises(NotImplementedError, match="played by its verifiers harness"):
        env.step("4")


# --- who plays it ---------------------------------------------------------------------------


def test_the_env_chooses_its_agent_program_and_refuses_another(tiny):
    assert env_agent_program(ENV) == "agentgym.envs.verifiers_env.agent:play"
    assert env_agent_program("tool_call") is None
    _, tokenizer = tiny
    player = make_player(load_config(overrides={"run.env": ENV}), tokenizer)
    assert isinstance(player, AgentPlayer)
    config = load_config(overrides={"run.env": ENV, "run.agent": "docs/tool_agent.py:agent"})
    with pytest.raises(ConfigError, match=r"run.agent 'docs/tool_agent.py:agent' with --env"):
        make_player(config, tokenizer)
    config = load_config(overrides={"run.env": ENV, "run.player": "players:ServedEnvPlayer"})
    with pytest.raises(ConfigError, match=r"run.player 'players:ServedEnvPlayer'"):
        make_player(config, tokenizer)


def test_verifiers_chat_program_streams_its_model_calls():
    # the premise of the episode test below: every call the harness makes is streamed
    assert "stream=True" in CHAT_PROGRAM_SOURCE
    assert 'stream_options={"include_usage": True}' in CHAT_PROGRAM_SOURCE


def test_an_episode_is_played_by_the_harness_through_the_endpoint_with_exact_ids(tiny):
    model, tokenizer = tiny
    config = load_config(overrides={"run.env": ENV})
    player = make_player(config, tokenizer)
    specs = (TaskSpec(task_id="sum-1", seed=3), TaskSpec(task_id="sum-4", seed=3))
    envs = [make_env(ENV) for _ in range(4)]
    params = SamplingParams(max_new_tokens=8, seed=5)
    try:
        played = player.play(HFPolicy(model, tokenizer), envs, Submission(specs, 2, params, 4096))
    finally:
        player.close()
    assert [t.task_id for t in played] == ["sum-1", "sum-1", "sum-4", "sum-4"]
    for t in played:
        assert t.error is None and t.scorable
        opening = envs[0].unwrapped.initial_messages(envs[0].unwrapped.load_task(t.task_id))
        prompt = tokenizer.apply_chat_template(
            [m.to_dict() for m in opening], add_generation_prompt=True, tokenize=True
        )
        prompt = list(prompt if isinstance(prompt, list) else prompt["input_ids"])
        assert list(t.tokens[: t.prompt_length]) == prompt  # the prompt, rendered once
        sampled = [tok for tok, m in zip(t.tokens, t.loss_mask, strict=True) if m]
        assert 0 < len(sampled) <= 8 and len(t.logprobs) == len(t.tokens)
        assert all(lp <= 0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m)
        # the rubric's reward: each @vf.reward's weighted score; the metric beside it
        reply = tokenizer.decode(sampled, skip_special_tokens=True).strip()
        assert t.reward_parts["brief"] == (0.5 if len(reply) <= 40 else 0.0)
        assert t.reward_parts["correct"] in (0.0, 1.0)
        assert t.reward == pytest.approx(t.reward_parts["brief"] + t.reward_parts["correct"])
        assert t.reward_parts["metric/reply_chars"] == len(reply)


def test_a_verifiers_episode_that_fails_raises_with_verifiers_errors():
    env = make_env(ENV).unwrapped
    # nothing listens on port 9: the harness's model calls fail, and verifiers records it
    with pytest.raises(VerifiersError, match=r"verifiers episode of task 'sum-0' failed: \w+"):
        asyncio.run(env.play("http://127.0.0.1:9/v1", "sum-0"))


@given(st.lists(st.one_of(st.none(), st.text(max_size=3)), max_size=8))
def test_row_ids_are_distinct_and_the_rows_own_where_they_are(ids):
    rows = [SimpleNamespace(data=SimpleNamespace(id=i, name=None)) for i in ids]
    got = row_ids(rows)
    assert len(got) == len(rows) and len(set(got)) == len(got)
    if all(ids) and len(set(ids)) == len(ids):
        assert got == ids
    else:
        assert got == [f"row-{n}" for n in range(len(ids))]


# --- train and evaluate through the CLI ---------------------------------------------------------

SMALL = [
    "grpo.tasks_per_step=2", "grpo.group_size=2", "sampling.max_new_tokens=8",
    "run.report_to=[]",
]  # fmt: skip


def test_train_two_steps_and_evaluate_on_a_verifiers_environment(tmp_path):
    run = tmp_path / "run"
    argv = ["train", "--env", ENV, "--model", "tiny-random", "--steps", "2"]
    assert main([*argv, "--output", str(run), *[f"--set={s}" for s in SMALL]]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["failures/fraction"] == 0 for r in rows)
    episodes = [json.loads(x) for x in (run / "completions.jsonl").read_text().splitlines()]
    assert episodes and all(
        {"brief", "correct", "metric/reply_chars"} <= set(e["reward_parts"]) for e in episodes
    )
    report = tmp_path / "report"
    evaluate = ["eval", "--env", ENV, "--model", str(run / "checkpoint-000002"), "--tasks", "2"]
    assert main([*evaluate, "--output", str(report), "--set=sampling.max_new_tokens=8"]) == 0
    tasks = json.loads((report / "report.json").read_text())["tasks"]["model"]
    assert [t["task_id"] for t in tasks] == ["sum-4", "sum-9"]
    assert all("correct" in t["greedy"]["parts"] for t in tasks)
    page = tmp_path / "view.html"
    assert main(["view", str(run), "--output", str(page)]) == 0
    assert "metric/reply_chars" in page.read_text()
