"""Dynamic sampling (`grpo.dynamic_sampling`, DAPO Sec. 3.2): a step samples more rounds until
it has `tasks_per_step` groups whose rewards differ, at most `max_resample_rounds`."""

from __future__ import annotations

import json

import pytest
import torch

from agentgym import records
from agentgym.cli import main
from agentgym.config import ConfigError, load_config
from agentgym.config.rules import broken_rules
from agentgym.run.dynamic import informative, sample_until_informative
from agentgym.types import StepRecord, TaskSpec, Trajectory

G = 2


def _round(name: str, rewards: list[float]) -> StepRecord:
    """A scored round: group i is task f"{name}{i}", its G episodes with the given rewards."""
    groups = len(rewards) // G
    trajectories = tuple(
        Trajectory(task_id=f"{name}{i // G}", group=i // G, tokens=(1, 2, 3), loss_mask=(0, 1, 1),
                   logprobs=(0.0, -0.5, -0.5), prompt_length=1, reward=r, reward_parts={},
                   turns=(), finish_reason="stop", truncated=False)
        for i, r in enumerate(rewards)
    )  # fmt: skip
    specs = tuple(TaskSpec(task_id=f"{name}{g}") for g in range(groups))
    rewards_t = torch.tensor(rewards)
    return StepRecord(1, 0, specs, trajectories, rewards=rewards_t, scorable=~rewards_t.isnan())


class Rounds:
    """`more()`: the rounds given, in order, counting the calls."""

    def __init__(self, *rounds: StepRecord):
        self.rounds, self.calls = list(rounds), 0

    def __call__(self) -> StepRecord:
        self.calls += 1
        return self.rounds.pop(0)


def _tasks(record: StepRecord) -> list[str]:
    return [t.task_id for t in record.trajectories]


def test_a_step_whose_groups_all_differ_samples_nothing_more():
    first = _round("a", [1.0, 0.0, 0.0, 1.0])
    more = Rounds()
    got = sample_until_informative(first, more, G, rounds=3)
    assert more.calls == 0 and _tasks(got) == _tasks(first)
    assert got.pipeline == {records.RESAMPLE_ROUNDS: 0.0, records.INFORMATIVE_GROUPS: 2.0}


def test_informative_groups_are_taken_in_the_order_played_and_renumbered():
    first = _round("a", [1.0, 1.0, 0.0, 1.0])  # a0 flat, a1 informative
    more = Rounds(_round("b", [0.0, 1.0, 0.5, 0.5]))  # b0 informative, b1 flat
    got = sample_until_informative(first, more, G, rounds=3)
    assert more.calls == 1
    assert _tasks(got) == ["a1", "a1", "b0", "b0"]
    assert [t.group for t in got.trajectories] == [0, 0, 1, 1]
    assert [s.task_id for s in got.specs] == ["a1", "b0"]
    assert got.rewards.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert got.scorable.all() and tuple(got.step_rewards.shape) == (4, 2)
    assert informative(got, G) == [0, 1]
    assert got.pipeline == {records.RESAMPLE_ROUNDS: 1.0, records.INFORMATIVE_GROUPS: 2.0}


def test_when_the_rounds_run_out_the_first_rounds_flat_groups_fill_the_step():
    first = _round("a", [1.0, 1.0, 0.0, 0.0])
    more = Rounds(_round("b", [0.0, 0.0, 1.0, 0.0]), _round("c", [1.0, 1.0, 1.0, 1.0]))
    got = sample_until_informative(first, more, G, rounds=2)
    assert more.calls == 2
    assert _tasks(got) == ["b1", "b1", "a0", "a0"]  # the one found, then a's first flat one
    assert got.pipeline == {records.RESAMPLE_ROUNDS: 2.0, records.INFORMATIVE_GROUPS: 1.0}
    none = sample_until_informative(first, Rounds(), G, rounds=0)
    assert _tasks(none) == _tasks(first) and none.pipeline[records.RESAMPLE_ROUNDS] == 0.0


def test_an_unscorable_episode_does_not_make_its_group_informative():
    first = _round("a", [1.0, float("nan"), 0.0, 1.0])  # a0 has one scored reward: flat
    assert informative(first, G) == [1]


def test_dynamic_sampling_is_refused_with_an_asynchronous_pipeline_and_under_torchrun():
    with pytest.raises(ConfigError, match="grpo.dynamic_sampling with pipeline.max_off_policy"):
        load_config(overrides={"grpo.dynamic_sampling": True,
                               "pipeline.max_off_policy_steps": 1})  # fmt: skip
    config = load_config(overrides={"grpo.dynamic_sampling": True})
    assert broken_rules(config) == []
    assert "grpo.dynamic_sampling under torchrun" in broken_rules(config, torchrun=True)[0]


@pytest.mark.slow
def test_a_run_with_dynamic_sampling_logs_its_rounds(tmp_path):
    run = tmp_path / "run"
    code = main(["train", "--env", "tool_call", "--model", "tiny-random", "--steps", "2",
                 "--set", "grpo.dynamic_sampling=true", "--set", "grpo.max_resample_rounds=1",
                 "--set", "grpo.group_size=2", "--set", "grpo.tasks_per_step=2",
                 "--set", "sampling.max_new_tokens=8", "--set", "run.report_to=[]",
                 "--output", str(run)])  # fmt: skip
    assert code == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # tiny-random earns nothing: every group is flat, so each step resamples
        assert r[records.RESAMPLE_ROUNDS] == 1.0 and r[records.INFORMATIVE_GROUPS] == 0.0
        assert r[records.ZERO_VARIANCE] == 1.0
