"""`update_stats`: the `update` stage on given trajectories, rewards and per-row advantages,
for the tests of what reaches the learner (tests/test_update.py, tests/test_learner.py)."""

from __future__ import annotations

import torch

from agentgym.learn.grpo import flat_groups
from agentgym.learn.update import own_step, update
from agentgym.types import StepRecord, sampled_targets


def record_of(trajectories, rewards: torch.Tensor, advantages: torch.Tensor, group_size: int):
    """A scored step record whose per-token advantages are `advantages` [N], one per row."""
    trajectories = tuple(trajectories)
    scorable = ~torch.isnan(rewards)
    return StepRecord(
        step=1,
        version=0,
        specs=(),
        trajectories=trajectories,
        rewards=rewards,
        scorable=scorable,
        advantages=advantages[:, None] * sampled_targets(trajectories),
        flat_groups=flat_groups(rewards, group_size, scorable=scorable),
    )


def update_stats(config, learner, trajectories, rewards, advantages, tokenizer, beta,
                 step=own_step, off_policy=False) -> dict[str, float]:  # fmt: skip
    """The update's stats on these trajectories (`learn.update.update`)."""
    record = record_of(trajectories, rewards, advantages, config.grpo.group_size)
    pad_id = tokenizer.pad_token_id
    return dict(update(record, learner, config, pad_id, beta, step, off_policy).stats)
