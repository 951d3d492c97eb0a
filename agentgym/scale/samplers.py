"""The samplers a run can have, and its player, made from the config.

`agentgym.scale.players.make_player` decides who plays an episode; `make_sampler` decides
where (`distributed.backend`: in this process or on Ray workers; under torchrun, on every
rank). The training loop only sees the
`agentgym.rollout.sampler.Sampler` it returns, and held-out evaluation the `Player`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import cast

import gymnasium as gym
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentgym import records
from agentgym.config import Config
from agentgym.env.core import make_env
from agentgym.policy.base import Policy
from agentgym.policy.hf import HFPolicy
from agentgym.rollout.player import Player, Submission
from agentgym.rollout.sampler import (
    InProcessSampler,
    QueuedSampler,
    Sampler,
    WeightSource,
    play_merged,
)
from agentgym.scale import ranks
from agentgym.scale.players import make_player
from agentgym.scale.ray_rollout import RayRollout, spread_groups
from agentgym.types import Trajectory


class RaySampler(QueuedSampler):
    """`RayRollout`'s workers as a `Sampler`: they play what is submitted, when polled."""

    def __init__(self, rollout: RayRollout) -> None:
        super().__init__()
        self.rollout = rollout

    def _play(self, submission: Submission) -> list[Trajectory]:
        return self.rollout.collect(submission)

    def load_weights(self, weights: WeightSource, version: int) -> dict[str, float | str]:
        seconds = self.rollout.load_weights(weights())
        self.version = version
        return {
            records.SYNC_SECONDS: seconds,
            records.WORKER_RESTARTS: float(self.rollout.restarts),
            records.SYNC_PATH: self.rollout.sync_path,  # distributed.weight_sync's, or fallback
        }

    def close(self) -> None:
        self.rollout.close()


class RankSampler(InProcessSampler):
    """Every torchrun rank plays its share of each step's task groups with its own copy of
    the learner's model (`distributed.learner` ddp: the copies are equal after every step);
    rank 0 gathers them, in order. The other ranks play theirs in `play_share`, called by
    their `ranks.follow` loop. Each episode draws from its own random stream (seed, task,
    member, turn), so it does not depend on which rank plays it."""

    def _play(self, submission: Submission) -> list[Trajectory]:
        shares = ranks.share_sample(
            submission, lambda: play_share(self.envs, self.policy, self.player, submission)
        )
        spans = spread_groups(len(submission.specs), ranks.world_size())
        out = []
        for span, played in zip(spans, shares, strict=True):
            out += [replace(t, group=t.group + span.start) for t in played]
        return out


def play_share(
    envs: Sequence[gym.Env], policy: Policy, player: Player, submission: Submission
) -> list[Trajectory]:
    """This rank's share of a step's task groups (`spread_groups`), played; their `group`
    numbers count within the share."""
    span = spread_groups(len(submission.specs), ranks.world_size())[ranks.rank()]
    if not len(span):
        return []
    return play_merged(player, policy, envs, submission.share(span.start, span.stop))


def ranks_sample(config: Config) -> bool:
    """Whether every torchrun rank samples its share: a DDP learner (its ranks hold whole,
    equal models) sampling with transformers in process; otherwise rank 0 samples all."""
    d = config.distributed
    return (
        ranks.active()
        and d.learner == "ddp"
        and d.backend == "none"
        and config.policy.backend == "hf"
    )


def sampler_envs(config: Config) -> list[gym.Env]:
    """The environments an in-process sampler plays in: tasks_per_step x group_size of
    them (none with Ray: the workers make their own)."""
    if config.distributed.backend == "ray":
        return []
    g, run = config.grpo, config.run
    return [make_env(run.env, **run.env_kwargs) for _ in range(g.tasks_per_step * g.group_size)]


def own_copy(
    policy: Policy, tokenizer: PreTrainedTokenizerBase, learner_model: object, plays_ahead: bool
) -> tuple[Policy, bool]:
    """The policy an in-process sampler plays with, and whether it has its own copy of the
    weights (to refresh after each step): `policy`, or, where it `plays_ahead` (asynchronous
    GRPO samples while the learner steps), a transformers policy of a copy of
    `learner_model` where `policy` samples with the learner's own model."""
    copies = policy.model is not learner_model
    if plays_ahead and not copies:
        own = cast(PreTrainedModel, copy.deepcopy(learner_model))
        return HFPolicy(own, tokenizer), True
    return policy, copies


def make_sampler(
    config: Config,
    envs: list[gym.Env],
    policy: Policy,
    tokenizer: PreTrainedTokenizerBase,
    start_model: str | None,
    weights: WeightSource,
    learner_model: object = None,
    plays_ahead: bool = False,
) -> Sampler:
    """The run's sampler: `distributed.backend: ray` starts Ray workers that load
    `start_model` and then `weights()`, each with its own player; otherwise the run's
    player (`make_player`) plays with `policy` in `envs` (`sampler_envs`; the sampler
    closes them and the player),
    refreshing its own copy of the weights when it does not sample with `learner_model`,
    and under torchrun every rank plays its share (`ranks_sample`). A sampler that
    `plays_ahead` (asynchronous GRPO) samples while the learner steps, so a transformers
    policy of the learner's own model gets a copy of it here (`AheadSampler` wraps what
    this returns, in `Run`)."""
    if config.distributed.backend == "ray":  # the workers make their own players
        return RaySampler(RayRollout(config, start_model, weights()))
    player = make_player(config, tokenizer)
    if ranks_sample(config):
        return RankSampler(envs, policy, player)
    policy, copies = own_copy(policy, tokenizer, learner_model, plays_ahead)
    return InProcessSampler(envs, policy, player, copies_weights=copies)
