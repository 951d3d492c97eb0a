"""Agent programs trained and evaluated through the endpoint (`run.agent`): the trajectories
are exactly what the server sampled, an episode the agent plays as the rollout would is the
rollout's token for token, split samples share the advantage with stated weights, and a
faulty agent makes an unscorable episode, never a dead run or an open port.

The agents are in `tests/agents.py`. `ScriptedTurns` (`test_serve`, a named stand-in for a
model) writes an environment's own demonstration, so that multi-turn episodes with real
tool calls can be compared; the rest samples with the real tiny-random model."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import psutil
import pytest
import torch
from test_serve import Recording, ScriptedTurns

from agentgym.cli import main
from agentgym.env.core import make_env
from agentgym.learn.advantages import split_weights, with_split_samples
from agentgym.policy.base import SamplingParams
from agentgym.policy.hf import HFPolicy
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.rollout.episodes import collect, use_chat_template
from agentgym.rollout.player import Submission
from agentgym.rollout.sampler import InProcessSampler
from agentgym.serve.agents import AgentPlayer, load_agent
from agentgym.types import TaskSpec, Trajectory

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer("tiny-random")


def _listening_ports() -> set[int]:
    return {
        c.laddr.port
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }


def _play(agent: str, policy, tokenizer, specs, group=1, *, env="tool_call", **options):
    """The agent's episodes of `specs`, and the player's port (closed on return)."""
    env_kwargs = options.pop("env_kwargs", {})
    params = options.pop("params", SamplingParams(max_new_tokens=24, seed=5))
    player = AgentPlayer(load_agent(agent), tokenizer, **options)
    try:
        envs = [make_env(env, **env_kwargs) for _ in range(len(specs) * group)]
        played = player.play(policy, envs, Submission(tuple(specs), group, params, 4096))
    finally:
        player.close()
    return played, player.server.port


def _same_episode(a: Trajectory, b: Trajectory) -> None:
    assert a.tokens == b.tokens and a.loss_mask == b.loss_mask
    assert a.prompt_length == b.prompt_length and a.turn_spans == b.turn_spans
    assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) <= 1e-5
    assert a.reward == pytest.approx(b.reward) and dict(a.reward_parts) == pytest.approx(
        dict(b.reward_parts)
    )


def test_an_agent_playing_as_the_rollout_plays_gives_its_ids_and_logprobs(tiny):
    """One request at a time, the same seed: the endpoint samples what the rollout does."""
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer)
    params = SamplingParams(max_new_tokens=40, seed=11)
    turns = []
    for seed in range(3):
        spec = [TaskSpec(seed=seed)]
        (ours,), _ = _play(
            "agents:as_the_rollout", policy, tokenizer, spec, params=params, concurrency=1
        )
        (theirs,) = collect([make_env("tool_call")], spec, 1, policy, tokenizer, params, 4096)
        assert ours.error is None
        _same_episode(ours, theirs)
        turns.append(len(ours.turn_spans))
    assert max(turns) > 1  # the env answered a cut-off call, and the agent went on


@pytest.mark.parametrize("tool_format", ["auto", "hermes", "react"])
def test_a_multi_turn_tool_episode_is_the_rollouts_token_for_token(tiny, tool_format):
    """The env's demonstration (real calls, run in the task's world) written by a stand-in
    model: the agent's tool loop and the rollout render the same conversation and the
    judge pays what the env paid, in the native format and in both text formats."""
    tokenizer = tiny[1]
    for seed in (0, 1):
        env = make_env("tool_call", tool_format=tool_format)
        use_chat_template(env, tokenizer)
        env.reset(seed=seed)
        turns = env.unwrapped.demonstration(env.unwrapped.task)
        assert len(turns) >= 2  # at least one call and the answer
        spec = [TaskSpec(seed=seed)]
        options = {"env_kwargs": {"tool_format": tool_format}, "tool_format": tool_format}
        (ours,), _ = _play(
            "agents:tool_loop", ScriptedTurns(tokenizer, turns), tokenizer, spec, **options
        )
        envs = [make_env("tool_call", tool_format=tool_format)]
        (theirs,) = collect(
            envs, spec, 1, ScriptedTurns(tokenizer, turns), tokenizer, SamplingParams(), 4096
        )
        _same_episode(ours, theirs)
        assert (
            ours.reward_parts["correctness"] == 1.0 and ours.counts["tool_calls"] == len(turns) - 1
        )


def test_the_registered_turn_limit_ends_an_agents_episode_as_it_ends_the_rollouts(tiny):
    """ToolCall-v0 registers max_episode_steps=6 (a TimeLimit wrapper): `env_step` ends the
    episode at turn 6 as the rollout's step does, and the judge stops there on a longer one."""
    tokenizer = tiny[1]
    env = make_env("tool_call")
    use_chat_template(env, tokenizer)
    env.reset(seed=0)
    call = env.unwrapped.demonstration(env.unwrapped.task)[0]  # a real call, made 9 times
    spec, limit = [TaskSpec(seed=0)], env.spec.max_episode_steps
    (theirs,) = collect(
        [make_env("tool_call")],
        spec,
        1,
        ScriptedTurns(tokenizer, [call] * 9),
        tokenizer,
        SamplingParams(),
        4096,
    )
    (ours,), _ = _play(
        "agents:as_the_rollout", ScriptedTurns(tokenizer, [call] * 9), tokenizer, spec
    )
    assert limit == 6 and len(theirs.turn_spans) == limit and theirs.truncated
    _same_episode(ours, theirs)
    (longer,), _ = _play(
        "agents:keeps_calling", ScriptedTurns(tokenizer, [call] * 9), tokenizer, spec
    )
    assert len(longer.turn_spans) == 9 and longer.error is None
    assert longer.reward == pytest.approx(theirs.reward)


def test_the_sampler_keeps_exactly_what_the_server_sampled_with_its_version(tiny):
    model, tokenizer = tiny
    policy = Recording(HFPolicy(model, tokenizer))
    player = AgentPlayer(load_agent("agents:summarising"), tokenizer)
    envs = [make_env("tool_call") for _ in range(4)]
    sampler = InProcessSampler(envs, policy, player)
    try:
        params = SamplingParams(max_new_tokens=8, seed=3)
        for version in (0, 3):
            sampler.load_weights(lambda: iter(()), version)
            policy.calls.clear()
            sampler.submit(Submission((TaskSpec(seed=1), TaskSpec(seed=2)), 2, params))
            played = sampler.poll(wait=True)
            assert [t.group for t in played] == [0, 0, 1, 1]
            generated = {tuple(p) + g.ids: g for p, g in policy.calls}
            rows = [r for t in played for r in (*t.split_samples, t)]
            assert sum(len(r.turn_spans) for r in rows) == len(policy.calls) == 12
            for row in rows:
                for start, end in row.turn_spans:  # each turn: a prompt the policy saw, its ids
                    gen = generated[row.tokens[:end]]
                    assert row.logprobs[start:end] == gen.logprobs
                sampled = {i for s, e in row.turn_spans for i in range(s, e)}
                assert {i for i, m in enumerate(row.loss_mask) if m} == sampled
                assert {row.token_versions[i] for i in sampled} == {version}
                assert all(v == -1 for i, v in enumerate(row.token_versions) if i not in sampled)
    finally:
        sampler.close()


def test_an_agent_that_rewrites_its_history_gives_split_samples(tiny):
    played, _ = _play("agents:summarising", HFPolicy(*tiny), tiny[1], [TaskSpec(seed=4)])
    (episode,) = played
    assert episode.error is None and episode.counts["split_samples"] == 1
    (earlier,) = episode.split_samples
    assert len(earlier.turn_spans) == 2 and len(episode.turn_spans) == 1
    summary = tiny[1].decode(episode.tokens[: episode.prompt_length])
    assert "So far: two tries." in summary and "Go on." not in summary


def test_split_samples_train_with_the_episodes_advantage_weighted():
    def row(length: int, sampled: range, *, split=()) -> Trajectory:
        mask = tuple(int(i in sampled) for i in range(length))
        zeros = (0.0,) * length
        return Trajectory(
            "t",
            0,
            tuple(range(length)),
            mask,
            zeros,
            1,
            0.0,
            {},
            (),
            "stop",
            False,
            split_samples=split,
        )

    earlier = row(4, range(2, 4))
    episode = row(5, range(3, 5), split=(earlier,))
    plain = row(3, range(1, 3))
    advantages = torch.tensor([[0.0, 0.0, 1.5, 1.5], [0.0, -2.0, -2.0, 0.0]])
    rows, out = with_split_samples([episode, plain], advantages)
    assert rows == [episode, plain, earlier] and split_weights(2) == [0.5, 0.5]
    # the episode's row at half weight; its earlier sample gets 1.5 x 0.5 on the tokens it
    # sampled (targets 1 and 2: tokens 2 and 3); the plain row as it was
    expected = torch.tensor(
        [[0.0, 0.0, 0.75, 0.75], [0.0, -2.0, -2.0, 0.0], [0.0, 0.75, 0.75, 0.0]]
    )
    assert torch.equal(out, expected)
    assert with_split_samples([plain], advantages[1:])[1] is not None


@pytest.mark.parametrize(
    ("agent", "error"),
    [
        ("agents:raises", "the agent raised RuntimeError: the agent's own bug"),
        ("agents:hangs", "the agent ran past run.agent_timeout_s (2 s)"),
        (
            "agents:sends_garbage",
            "the agent returned a str; return a number, an AgentReward, the messages, or None",
        ),
        ("agents:silent", "the agent sent no request"),
    ],
)
def test_a_faulty_agent_makes_an_unscorable_episode_and_leaves_no_port_open(tiny, agent, error):
    before = _listening_ports()
    played, port = _play(agent, HFPolicy(*tiny), tiny[1], [TaskSpec(seed=1)], 2, timeout_s=2.0)
    assert [t.error for t in played] == [error, error]
    assert not any(t.scorable for t in played)
    assert port not in _listening_ports() and _listening_ports() <= before


def test_an_agent_that_returns_a_number_is_paid_it(tiny):
    played, _ = _play("agents:scores_itself", HFPolicy(*tiny), tiny[1], [TaskSpec(seed=1)], 2)
    assert [(t.reward, dict(t.reward_parts), t.error) for t in played] == [
        (1.0, {"agent": 1.0}, None)
    ] * 2


@pytest.mark.parametrize(
    "where",
    ["agents", "agents:nope", "agents:not_async", "no_such_module:agent", "missing/file.py:agent"],
)
def test_an_agent_that_cannot_be_loaded_is_refused_naming_run_agent(where):
    with pytest.raises(ValueError, match=r"^run.agent '"):
        load_agent(where)


def _demonstrated(env: gym.Env, seed: int) -> tuple[float, list[dict]]:
    """The env's demonstration of a task played through `step`: its reward, and the
    conversation as OpenAI messages (assistant turns as text)."""
    obs, _ = env.reset(seed=seed)
    turns = env.unwrapped.demonstration(env.unwrapped.task)
    messages, total = list(obs), 0.0
    for turn in turns:
        replies, reward, terminated, truncated, _ = env.step(turn)
        total += reward
        messages += [{"role": "assistant", "content": turn}, *replies]
        if terminated or truncated:
            break
    return total, messages


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("math", {}),
        ("code", {}),
        ("tool_call", {}),
        (
            "agentgym/Mix-v0",
            {"envs": [{"env": "tool_call", "name": "tools"}, {"env": "math", "name": "math"}]},
        ),
        ("function_calls", {}),
        (
            "agentgym/Tasks-v0",
            {
                "data": str(ROOT / "docs" / "function_calls.jsonl"),
                "prompt_column": "query",
                "tools_column": "tools",
                "expected_calls_column": "answers",
            },
        ),
    ],
)
def test_every_built_in_env_judges_a_conversation_as_it_rewarded_it(name, kwargs):
    env = make_env(name, **kwargs)
    for seed in range(3):
        reward, messages = _demonstrated(env, seed)
        task = env.unwrapped.task
        assert env.unwrapped.judge(messages, task)[0] == pytest.approx(reward)
        assert env.unwrapped.judge(messages[:2], task)[0] != pytest.approx(reward)  # no answer


@pytest.mark.parametrize("with_tools", [False, True])
def test_tasks_from_a_data_file_judge_a_conversation_by_its_boxed_answer(tmp_path, with_tools):
    # The judge a data file names (math, exact, ...) is not the env's `judge` of a conversation.
    data = tmp_path / "d.jsonl"
    rows = [
        {"prompt": "What is 2 + 3?", "answer": 5, "split": "train"},
        {"prompt": "What is 2 + 4?", "answer": 6, "split": "test"},
    ]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    kwargs = {"tools": ["test_tasks_env:add"], "tool_format": "hermes"} if with_tools else {}
    env = make_env("agentgym/Tasks-v0", data=str(data), split_column="split", **kwargs)
    obs, _ = env.reset(options={"task_id": "train/0"})
    task = env.unwrapped.task
    call = {"type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    turns = [{"role": "assistant", "content": "", "tool_calls": [call]}] if with_tools else []
    turns.append({"role": "assistant", "content": "So \\boxed{5}"})
    total = 0.0
    for turn in turns:
        _, reward, *_ = env.step(env.unwrapped.turn_text(turn))
        total += reward
    wrong = [*turns[:-1], {"role": "assistant", "content": "So \\boxed{6}"}]
    assert env.unwrapped.judge([*obs, *turns], task)[0] == pytest.approx(total)
    assert env.unwrapped.judge([*obs, *wrong], task)[0] < total


def test_the_docs_agent_trains_two_steps_and_evaluates(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    agent = str(ROOT / "docs" / "tool_agent.py") + ":agent"
    small = [
        "--set",
        "grpo.tasks_per_step=2",
        "--set",
        "grpo.group_size=2",
        "--set",
        "sampling.max_new_tokens=16",
    ]
    run = [
        "train",
        "--env",
        "tool_call",
        "--model",
        "tiny-random",
        "--agent",
        agent,
        "--steps",
        "2",
    ]
    assert (
        main(
            [
                *run,
                "--output",
                "run",
                *small,
                "--set",
                "eval.every=0",
                "--set",
                "eval.report_tasks=0",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in Path("run/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["agent/split_samples"] == 0 and r["failures/fraction"] == 0 for r in rows)
    evaluate = ["eval", "--env", "tool_call", "--model", "run/checkpoint-000002", "--agent", agent]
    assert (
        main(
            [*evaluate, "--tasks", "2", "--output", "report", "--set", "sampling.max_new_tokens=16"]
        )
        == 0
    )
    report = json.loads(Path("report/report.json").read_text())
    assert report["meta"]["agent"] == agent and len(report["tasks"]["model"]) == 2


def test_an_agent_plays_ahead_of_the_learner_with_the_versions_the_rule_names(tmp_path):
    """Asynchronous GRPO with an agent program (k = 1): the agent's endpoint serves a copy
    of the model that takes each version as its step is played, while the learner steps and
    the held-out evaluation plays the learner's own: step t is played with version
    max(0, t - 2), as the in-process sampler plays it."""
    agent = str(ROOT / "docs" / "tool_agent.py") + ":agent"
    sets = [
        "grpo.tasks_per_step=2", "grpo.group_size=2", "sampling.max_new_tokens=16",
        "pipeline.max_off_policy_steps=1", "eval.every=2", "eval.tasks=2",
        "eval.report_tasks=0", "run.report_to=[]",
    ]  # fmt: skip
    run = tmp_path / "run"
    argv = ["train", "--env", "tool_call", "--model", "tiny-random", "--agent", agent]
    assert main([*argv, "--steps", "3", "--output", str(run), *(f"--set={s}" for s in sets)]) == 0
    trained = [json.loads(x) for x in (run / "trained.jsonl").read_text().splitlines()]
    versions = {r["step"]: {tuple(g["versions"]) for g in r["groups"]} for r in trained}
    assert versions == {1: {(0, 0)}, 2: {(0, 0)}, 3: {(1, 1)}}
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 1.0]
    assert [r["step"] for r in rows if "eval/correctness" in r] == [2, 3]  # every 2, the last


def test_an_agent_task_gives_the_prompt_as_task_prompt():
    from agentgym import Task
    from agentgym.serve.agents import AgentTask

    task = AgentTask("t/1", [{"role": "user", "content": "2 + 2?"}], [], Task("t/1", "2 + 2?"))
    assert task.prompt == "2 + 2?" == task.task.prompt
