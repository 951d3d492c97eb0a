"""The `score` stage of a training step: from played episodes to the rewards it learns from.

An episode's reward is the environment's, plus the user reward functions' weighted
values (`agentgym.rewards.functions`), less the length penalty (the tutorial's FAQ 7:
`grpo.length_penalty` per sampled token). An unscorable episode (its environment or a
reward function failed) gets NaN, and the mask says so: the advantage estimators leave it
out of every statistic and give it advantage 0. Each step's environment reward is kept
beside the episode's, on the tokens it follows (`StepRecord.step_rewards`), for
turn-level credit.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from agentgym.rewards.functions import RewardFunctions
from agentgym.types import StepRecord, step_reward_targets


def score(
    record: StepRecord, reward_fns: RewardFunctions | None, length_penalty: float = 0.0
) -> StepRecord:
    """`record` with its trajectories scored by `reward_fns` (None: as the environment
    scored them) and its `rewards` [N], `scorable` [N] and `step_rewards` [N, T] set."""
    trajectories = list(record.trajectories)
    if reward_fns is not None:
        trajectories = reward_fns.score(trajectories)
    scorable = torch.tensor([t.scorable for t in trajectories], dtype=torch.bool)
    # NaN as well as the mask, so that every statistic over them leaves them out
    rewards = torch.tensor([t.reward if t.scorable else math.nan for t in trajectories])
    if length_penalty:
        lengths = torch.tensor([float(t.completion_length) for t in trajectories])
        rewards = rewards - length_penalty * lengths
    return replace(
        record,
        trajectories=tuple(trajectories),
        rewards=rewards,
        scorable=scorable,
        step_rewards=step_reward_targets(trajectories),
    )
