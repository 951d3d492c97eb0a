"""Per-step rewards reach the record: each trajectory keeps its steps' rewards with the span
of sampled ids each follows, and `score` keeps them beside the episode reward
(`StepRecord.step_rewards`) without changing the episode reward."""

from __future__ import annotations

import math

import pytest
import torch
from test_tool_rollout import _play, _reference_script

from agentgym.rewards.score import score
from agentgym.types import StepRecord, TaskSpec, Trajectory, Turn, step_reward_targets


def _trajectory(spans, rewards, length=10, error=None) -> Trajectory:
    mask = [0] * length
    for a, b in spans:
        mask[a:b] = [1] * (b - a)
    return Trajectory(
        task_id="t",
        group=0,
        tokens=tuple(range(length)),
        loss_mask=tuple(mask),
        logprobs=(0.0,) * length,
        prompt_length=3,
        reward=sum(rewards),
        reward_parts={},
        turns=tuple(Turn("a", (), r, {}) for r in rewards),
        finish_reason="stop",
        truncated=False,
        turn_spans=tuple(spans),
        error=error,
    )


def test_each_step_reward_sits_on_the_last_id_its_turn_sampled():
    # spans [3, 5) and [7, 9): ids 4 and 8 end the turns; id i is predicted at position i - 1
    traj = _trajectory([(3, 5), (7, 9)], [0.25, 1.0])
    assert traj.step_rewards == ((0.25, (3, 5)), (1.0, (7, 9)))
    row = step_reward_targets([traj])[0]
    expected = torch.zeros(9)
    expected[3], expected[7] = 0.25, 1.0
    assert torch.equal(row, expected)


def test_a_turn_that_sampled_nothing_adds_its_reward_to_the_last_sampled_id():
    traj = _trajectory([(3, 5), (6, 6)], [0.5, 0.25])
    row = step_reward_targets([traj])[0]
    assert row[3].item() == 0.75 and row.sum().item() == 0.75


def test_rows_are_padded_to_the_longest_and_unscorable_rows_are_nan():
    short = _trajectory([(3, 5)], [1.0], length=6)
    failed = _trajectory([(3, 5)], [1.0], error="ValueError: boom")
    out = step_reward_targets([short, failed])
    assert out.shape == (2, 9)
    assert out[0].tolist() == [0, 0, 0, 1.0, 0, 0, 0, 0, 0]
    assert all(math.isnan(v) for v in out[1].tolist())


def test_scoring_keeps_the_step_rewards_of_a_played_episode_beside_its_reward(tiny):
    """A ToolCall episode played by the turn loop pays each step the change in its score:
    the steps' rewards, read from the record, sum to the episode reward, which scoring
    leaves as the environment gave it."""
    _, tokenizer = tiny
    task_id = "chain/train/7"
    trajs, _ = _play(tokenizer, task_id, "hermes", _reference_script(task_id, "hermes"))
    record = score(StepRecord(1, 0, (TaskSpec(task_id=task_id),), tuple(trajs)), None)
    assert record.step_rewards is not None and record.rewards is not None
    for i, traj in enumerate(trajs):
        assert len(traj.step_rewards) == len(traj.turns) == 3  # two calls, then the answer
        per_step = [r for r, _ in traj.step_rewards]
        assert per_step[-1] != 0.0  # the answer's step is paid
        assert sum(per_step) == pytest.approx(traj.reward)
        assert record.step_rewards[i].sum().item() == pytest.approx(traj.reward, abs=1e-6)
        assert record.rewards[i].item() == torch.tensor(traj.reward).item()  # bitwise
        ends = {b - 2 for _, b in traj.turn_spans}
        nonzero = set(record.step_rewards[i].nonzero().flatten().tolist())
        assert nonzero <= ends
