"""Reward functions and environments that fail: the sample is unscorable, the run goes on.

Reward functions come from `reward_fns_fixture` (the worker imports them by
name); `FlakyEnv` is a two-turn environment whose `step` raises on the turn
it is told to.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from agentgym.config import ConfigError, RewardsConfig, load_config
from agentgym.env.core import AgentEnv, Feedback, Task, make_env
from agentgym.learn import grpo
from agentgym.learn.learner import Learner
from agentgym.policy.base import Generation, SamplingParams
from agentgym.policy.hf import HFPolicy
from agentgym.rewards.functions import RewardFunctions
from agentgym.rollout.episodes import TaskSpec, collect
from agentgym.rollout.player import TurnPlayer
from agentgym.rollout.sampler import InProcessSampler
from agentgym.run.record import step_metrics
from agentgym.run.resume import Progress, Trainer
from agentgym.run.runlog import RunLog, failure_metrics, step_note
from agentgym.run.train import train_step
from agentgym.types import Message, Trajectory, Turn


class FlakyEnv(AgentEnv):
    """Two turns: "Go on." after the first, then the share of digits as the reward.

    Args:
        fail_turn: The turn (1 or 2) whose `step` raises RuntimeError; None: none.
        reward: Overrides the final reward (a NaN one, say).
    """

    def __init__(self, fail_turn: int | None = None, reward: float | None = None, **kwargs):
        super().__init__(**kwargs)
        self.fail_turn, self.fixed_reward, self.turn = fail_turn, reward, 0

    def num_tasks(self, split):
        return 4

    def task_id(self, split, index):
        return f"flaky/{split}/{index}"

    def load_task(self, task_id):
        self.turn = 0
        return Task(task_id=task_id, prompt=f"Write digits ({task_id}).")

    def respond(self, action):
        self.turn += 1
        if self.turn == self.fail_turn:
            raise RuntimeError(f"turn {self.turn} broke")
        if self.turn == 1:
            return Feedback((Message("user", "Go on."),), 0.0, {}, terminated=False)
        share = sum(c.isdigit() for c in action) / max(len(action), 1)
        reward = share if self.fixed_reward is None else self.fixed_reward
        return Feedback((), reward=reward, reward_parts={"digits": share}, terminated=True)


if "failures/Flaky-v0" not in gym.registry:
    gym.register(id="failures/Flaky-v0", entry_point=FlakyEnv, max_episode_steps=4)


class FixedPolicy:
    """Answers every turn of every episode with `text` and the stop token."""

    def __init__(self, tokenizer, text: str = "12 34"):
        self.ids = (*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id)

    def generate(self, prompts, params, streams=None):
        return [Generation(self.ids, (-0.5,) * len(self.ids), "stop") for _ in prompts]


def _trajectory(task_id: str = "t/0", reward: float = 0.0, first: str = "system") -> Trajectory:
    """A finished one-turn episode, built by hand."""
    turn = Turn("The answer is 4.", (Message("user", "Thanks."),), reward, {"correctness": reward})
    return Trajectory(
        task_id=task_id, group=0, tokens=(1, 2, 3), loss_mask=(0, 1, 1),
        logprobs=(0.0, -0.5, -0.5), prompt_length=1, reward=reward,
        reward_parts={"correctness": reward}, turns=(turn,), finish_reason="stop",
        truncated=False, prompt_messages=(Message("system", first), Message("user", "2 + 2?")),
    )  # fmt: skip


def _functions(*names: str, timeout_s: float = 10.0) -> RewardFunctions:
    entries = [{"fn": f"reward_fns_fixture:{name}"} for name in names]
    return RewardFunctions(RewardsConfig(functions=entries, timeout_s=timeout_s))


def _gone(pid: int) -> bool:
    """No such process, or only its zombie is left."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


# -- reward functions ---------------------------------------------------------


@pytest.fixture(scope="module")
def told():
    """`half` (weight 2), then `as_told`, which does what the task id says; 1 s timeout."""
    config = RewardsConfig(
        functions=[
            {"fn": "reward_fns_fixture:half", "weight": 2.0},
            {"fn": "reward_fns_fixture:as_told"},
        ],
        timeout_s=1.0,
    )
    with RewardFunctions(config) as fns:
        yield fns


def test_reward_functions_add_their_weighted_values_as_parts(told):
    (scored,) = told.score([_trajectory(reward=1.0)])
    assert scored.scorable
    assert scored.reward == 1.0 + 2.0 * 0.5 + 0.5
    assert scored.reward_parts == {"correctness": 1.0, "half": 1.0, "as_told": 0.5}


def test_a_reward_function_gets_the_whole_conversation(told):
    # system, user, the assistant's turn, the environment's reply: 4 messages
    (scored,) = told.score([_trajectory(task_id="count")])
    assert scored.reward_parts["as_told"] == 4.0


def test_turns_is_a_list_of_the_assistants_turns_for_a_function_that_names_it():
    two = Turn("Let me look.", (Message("tool", "4"),), 0.0, {})
    first = _trajectory()
    episode = replace(first, turns=(two, *first.turns))
    with _functions("turn_count", "exact_five") as fns:
        (scored,) = fns.score([episode])
    assert scored.reward_error is None, scored.reward_error
    assert scored.reward_parts["turn_count"] == 2.0  # ["Let me look.", "The answer is 4."]
    assert scored.reward_parts["exact_five"] == 1.0  # called without `turns`


@pytest.mark.parametrize(
    ("task_id", "message"),
    [
        ("raise", "raised ValueError: boom"),
        ("nan", "returned nan"),
        ("inf", "returned inf"),
        ("none", "returned None, not a number"),
        ("text", "returned '1.0', not a number"),
        ("exit", "ended its worker process (exit code 3)"),
    ],
)
def test_a_failing_reward_function_makes_only_that_episode_unscorable(told, task_id, message):
    failed, fine = told.score([_trajectory(task_id, reward=1.0), _trajectory(reward=1.0)])
    assert not failed.scorable
    assert failed.reward_error == f"reward_fns_fixture:as_told {message}"
    # `half` ran first and succeeded; the failure leaves its part out too
    assert failed.reward == 1.0 and failed.reward_parts == {"correctness": 1.0}
    assert fine.scorable and fine.reward == 2.5  # the next episode is scored (restarted after exit)


def test_an_episode_that_is_already_unscorable_is_not_scored():
    broken = replace(_trajectory(), error="RuntimeError: turn 1 broke")
    with _functions("half") as fns:
        (out,) = fns.score([broken])
        assert fns.worker_pid is None  # nothing was called, so no worker was started
    assert out is broken


def test_a_reward_function_past_the_timeout_is_stopped_and_its_worker_killed(told):
    told.score([_trajectory()])  # a running worker: its start-up is not what is timed
    pid = told.worker_pid
    start = time.monotonic()
    (slow,) = told.score([_trajectory(task_id="slow")])
    elapsed = time.monotonic() - start
    assert 1.0 <= elapsed < 3.5  # the function sleeps 60 s
    assert slow.reward_error == (
        "reward_fns_fixture:as_told returned nothing within rewards.timeout_s=1 s "
        "(its worker was killed)"
    )
    assert told.worker_pid is None and _gone(pid)
    (fast,) = told.score([_trajectory()])  # a fresh worker answers the next call
    assert fast.scorable and fast.reward == 1.5
    assert told.worker_pid not in (None, pid)


def test_the_timeout_kill_reaches_the_processes_the_function_started(tmp_path, monkeypatch):
    pidfile = tmp_path / "sleeper.pid"
    monkeypatch.setenv("REWARD_FIXTURE_PIDFILE", str(pidfile))
    with _functions("starts_a_sleeper", timeout_s=2.0) as fns:
        (out,) = fns.score([_trajectory()])
    assert not out.scorable
    sleeper = int(pidfile.read_text())
    deadline = time.monotonic() + 5.0
    while not _gone(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(sleeper)


def test_close_ends_the_worker():
    fns = _functions("half")
    fns.score([_trajectory()])
    pid = fns.worker_pid
    fns.close()
    assert fns.worker_pid is None and _gone(pid)


@pytest.mark.parametrize(
    ("functions", "expected"),
    [
        (["no_such_module_xyz:f"], "rewards.functions[0].fn = 'no_such_module_xyz:f': cannot "
                                   "import module 'no_such_module_xyz'"),
        (["reward_fns_fixture:half", "reward_fns_fixture:nope"],
         "rewards.functions[1].fn = 'reward_fns_fixture:nope': module 'reward_fns_fixture' has "
         "no function 'nope'; its functions: as_told, digit_share, exact_five, half,"),
        (["reward_fns_fixture:takes_no_kwargs"], "give it **kwargs"),
        (["reward_fns_fixture:half", "test_failures:half"],
         "rewards.functions[1].fn = 'test_failures:half': the name 'half' is taken by "
         "rewards.functions[0]"),
    ],
)  # fmt: skip
def test_a_function_that_cannot_be_used_fails_up_front_naming_the_field(functions, expected):
    config = RewardsConfig(functions=[{"fn": fn} for fn in functions])
    with pytest.raises(ConfigError) as err:
        RewardFunctions(config)
    assert expected in str(err.value)


def half(**kwargs):  # a second "half", for the name clash above
    return 0.5


def test_a_malformed_function_name_is_a_config_error():
    with pytest.raises(ConfigError) as err:
        load_config(overrides={"rewards.functions": [{"fn": "reward_fns_fixture.half"}]})
    assert "rewards.functions.0.fn" in str(err.value)
    assert "is not 'package.module:function'" in str(err.value)


# -- environments -------------------------------------------------------------


def test_an_env_step_that_raises_ends_only_that_episode(tiny):
    _, tokenizer = tiny
    envs = [make_env("failures/Flaky-v0", fail_turn=t) for t in (None, 1, None, 2)]
    params = SamplingParams(max_new_tokens=8)
    trajs = collect(envs, [TaskSpec(seed=0)], 4, FixedPolicy(tokenizer), tokenizer, params)
    assert [t.error for t in trajs] == [None, "RuntimeError: turn 1 broke", None,
                                        "RuntimeError: turn 2 broke"]  # fmt: skip
    assert [len(t.turns) for t in trajs] == [2, 1, 2, 2]
    assert [t.truncated for t in trajs] == [False, True, False, True]
    assert [t.scorable for t in trajs] == [True, False, True, False]
    assert [len(t.turn_spans) for t in trajs] == [2, 1, 2, 2]
    # "12 34": 4 digits of 5 characters; the ones that failed are left out, not 0 or NaN
    rewards = torch.tensor([t.reward for t in trajs])
    scorable = torch.tensor([t.scorable for t in trajs])
    advantages = grpo.group_advantages(rewards, 4, scorable=scorable)
    assert torch.equal(advantages, torch.zeros(4))  # two equal scorable rewards: no signal
    assert failure_metrics(trajs) == {"reward/failed": 0.0, "env/errors": 2.0,
                                      "failures/fraction": 0.5,
                                      "env/first_error": "RuntimeError: turn 1 broke"}  # fmt: skip
    # the same environments play the next rollout as usual
    again = collect(envs, [TaskSpec(seed=1)], 4, FixedPolicy(tokenizer), tokenizer, params)
    assert [t.error is None for t in again] == [True, False, True, False]


def test_a_non_finite_env_reward_makes_the_episode_unscorable(tiny):
    _, tokenizer = tiny
    envs = [make_env("failures/Flaky-v0", reward=r) for r in (1.0, math.nan)]
    params = SamplingParams(max_new_tokens=8)
    good, bad = collect(envs, [TaskSpec(seed=0)], 2, FixedPolicy(tokenizer), tokenizer, params)
    assert good.scorable and good.reward == 1.0
    assert not bad.scorable and bad.reward_error == "environment reward is nan"
    assert failure_metrics([good, bad])["reward/failed"] == 1.0


# -- a training step, and its log ---------------------------------------------


def test_a_train_step_counts_the_failures_and_logs_their_first_messages(tiny, tmp_path):
    model, tokenizer = tiny
    config = load_config(overrides={
        "grpo.group_size": 4, "grpo.tasks_per_step": 1, "grpo.beta": 0.0,
        "sampling.max_new_tokens": 6,
        "rewards.functions": [{"fn": "reward_fns_fixture:raises_if_flagged"}],
    })  # fmt: skip
    # member 1's env raises; member 2's system prompt makes the reward function raise
    envs = [make_env("failures/Flaky-v0"), make_env("failures/Flaky-v0", fail_turn=1),
            make_env("failures/Flaky-v0", system_prompt="flagged"),
            make_env("failures/Flaky-v0")]  # fmt: skip
    learner = Learner(copy.deepcopy(model), config)
    policy = HFPolicy(learner.model, tokenizer)
    trainer = Trainer(learner, tokenizer, np.random.default_rng(0), Progress())
    sampler = InProcessSampler(envs, policy, TurnPlayer(tokenizer))
    with RewardFunctions(config.rewards) as fns:
        record = train_step(config, trainer, sampler, fns)
    trajs, metrics = record.trajectories, step_metrics(record, learner.beta, 0.0)
    assert [t.scorable for t in trajs] == [True, False, False, True]
    assert metrics["env/errors"] == 1.0
    assert metrics["env/first_error"] == "RuntimeError: turn 1 broke"
    assert metrics["reward/failed"] == 1.0
    assert metrics["reward/first_error"] == (
        "reward_fns_fixture:raises_if_flagged raised ValueError: flagged episode"
    )
    scored = [trajs[0].reward, trajs[3].reward]
    assert all(t.reward_parts["raises_if_flagged"] == 0.25 for t in (trajs[0], trajs[3]))
    assert metrics["reward/mean"] == pytest.approx(sum(scored) / 2)
    log = RunLog(tmp_path, report_to=["tensorboard"])
    log.metrics(1, metrics)
    log.close()
    (row,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert row["env/first_error"] == "RuntimeError: turn 1 broke"
    assert row["reward/failed"] == 1.0
    assert os.listdir(tmp_path / "tb")  # the strings did not stop the TensorBoard scalars
    # the console's step line names both first errors where the user looks
    note = step_note(metrics)
    assert "reward failed on 1: reward_fns_fixture:raises_if_flagged raised ValueError" in note
    assert "env failed on 1: RuntimeError: turn 1 broke" in note


def test_a_step_line_with_no_scored_episode_says_so_and_cuts_a_long_message_to_one_line():
    metrics = {"reward/mean": math.nan, "step_seconds": 2.0, "reward/failed": 4.0,
               "reward/first_error": "m:f raised KeyError: 'x'\n" + "y" * 500}  # fmt: skip
    note = step_note(metrics)
    assert note.startswith("reward n/a (no episode scored)  2.0s/step  reward failed on 4: ")
    assert "\n" not in note and "nan" not in note and note.endswith("...")
    assert len(note) < 250
    assert step_note({"reward/mean": 0.5, "step_seconds": 1.0}) == "reward +0.500  1.0s/step"
