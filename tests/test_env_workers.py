"""Environment calls at once (`run.env_workers`, issue 38): a turn's `env.step` calls, and the
resets, of every live episode run on threads together, so tools that wait on I/O wait
together; results are applied in the episodes' order, so a seed gives the same trajectories
as one call after another. Overlap is counted (calls inside `step` at the same moment),
never timed."""

from __future__ import annotations

import threading

import pytest

from agentgym.config import ConfigError, load_config
from agentgym.env.core import AgentEnv, Feedback, Task, make_env
from agentgym.policy.base import SamplingParams
from agentgym.policy.hf import HFPolicy
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.rollout.episodes import TaskSpec, collect
from agentgym.types import Message


class Meeting:
    """Counts the calls inside `enter` at once; each waits (up to `wait_s`) until `expected`
    calls are inside, so calls made at once all meet and calls made one by one do not."""

    def __init__(self, expected: int, wait_s: float = 2.0):
        self.expected, self.wait_s = expected, wait_s
        self.inside = self.most = self.calls = 0
        self.cond = threading.Condition()

    def enter(self) -> None:
        with self.cond:
            self.calls += 1
            self.inside += 1
            self.most = max(self.most, self.inside)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.most >= self.expected, self.wait_s)
            self.inside -= 1


class TwoTurnEnv(AgentEnv):
    """Two turns: each step enters `meeting` (the turn's tool call), the second ends the
    episode with a reward from the reply's length and the task's index."""

    def __init__(self, meeting: Meeting | None = None, **kwargs):
        super().__init__(**kwargs)
        self.meeting, self.turn, self.index = meeting, 0, 0

    def num_tasks(self, split):
        return 8

    def task_id(self, split, index):
        return f"two/{split}/{index}"

    def load_task(self, task_id):
        self.index, self.turn = int(task_id.rsplit("/", 1)[1]), 0
        return Task(task_id=task_id, prompt=f"Say something about {self.index}.")

    def respond(self, action):
        if self.meeting is not None:
            self.meeting.enter()
        self.turn += 1
        done = self.turn == 2
        reward = (len(action) % 7 + self.index) / 10 if done else 0.0
        reply = () if done else (Message("user", f"Tool says {self.index * 3}."),)
        return Feedback(reply, reward=reward, reward_parts={"len": reward}, terminated=done)


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = load_model_and_tokenizer("tiny-random")
    return HFPolicy(model, tokenizer), tokenizer


def _play(tiny, envs, workers, specs, group=2):
    policy, tokenizer = tiny
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)
    return collect(envs, specs, group, policy, tokenizer, params, env_workers=workers)


def test_every_live_episodes_step_of_a_turn_is_made_at_once(tiny):
    meeting = Meeting(expected=6)
    envs = [TwoTurnEnv(meeting) for _ in range(6)]
    played = _play(tiny, envs, None, [TaskSpec(seed=s) for s in range(3)])
    assert [len(t.turns) for t in played] == [2] * 6
    assert meeting.calls == 12 and meeting.most == 6  # both turns: all six inside at once


def test_one_worker_calls_the_environments_one_after_another(tiny):
    meeting = Meeting(expected=2, wait_s=0.01)
    envs = [TwoTurnEnv(meeting) for _ in range(4)]
    _play(tiny, envs, 1, [TaskSpec(seed=s) for s in range(2)])
    assert meeting.calls == 8 and meeting.most == 1


@pytest.mark.parametrize("workers", [None, 2, 3])
def test_a_seed_gives_the_same_trajectories_with_any_number_of_workers(tiny, workers):
    specs = [TaskSpec(seed=s) for s in range(4)]
    serial = _play(tiny, [TwoTurnEnv() for _ in range(8)], 1, specs)
    parallel = _play(tiny, [TwoTurnEnv() for _ in range(8)], workers, specs)
    assert parallel == serial
    assert len({t.reward for t in serial}) > 1  # the episodes differ: the order matters


def test_the_same_on_a_built_in_tool_env_with_its_world(tiny):
    specs = [TaskSpec(seed=s) for s in range(3)]

    def envs():
        return [make_env("tool_call", families=["calculator", "sql"]) for _ in range(6)]

    serial, parallel = _play(tiny, envs(), 1, specs), _play(tiny, envs(), None, specs)
    assert parallel == serial
    assert {t.task_id.split("/")[0] for t in serial} >= {"calculator"}


def test_a_step_that_raises_fails_its_episode_only_with_workers(tiny):
    class Flaky(TwoTurnEnv):
        def respond(self, action):
            if self.index % 2:
                raise RuntimeError("backend down")
            return super().respond(action)

    envs = [Flaky() for _ in range(4)]
    played = _play(tiny, envs, None, [TaskSpec(task_id=f"two/train/{i}") for i in (0, 1)])
    assert [t.error for t in played] == [None, None, *["RuntimeError: backend down"] * 2]
    assert [len(t.turns) for t in played] == [2, 2, 1, 1]


def test_env_workers_is_a_run_option_of_at_least_one():
    assert load_config(None, {"run.env_workers": 4}).run.env_workers == 4
    with pytest.raises(ConfigError, match="run.env_workers"):
        load_config(None, {"run.env_workers": 0})
