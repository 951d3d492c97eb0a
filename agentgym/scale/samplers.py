"""The samplers a run can have, made from the config: in this process, or on Ray workers.

`make_sampler` is the one place that reads `distributed.backend`; the training
loop only sees the `agentgym.rollout.sampler.Sampler` it returns.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
from transformers import PreTrainedTokenizerBase

from agentgym import records
from agentgym.config import Config
from agentgym.env.core import make_env
from agentgym.policy.base import Policy, SamplingParams
from agentgym.rollout.episodes import TaskSpec
from agentgym.rollout.sampler import InProcessSampler, QueuedSampler, Sampler, WeightSource
from agentgym.scale.ray_rollout import RayRollout
from agentgym.types import Trajectory


class RaySampler(QueuedSampler):
    """`RayRollout`'s workers as a `Sampler`: they play what is submitted, when polled."""

    def __init__(self, rollout: RayRollout) -> None:
        super().__init__()
        self.rollout = rollout

    def _play(
        self,
        specs: Sequence[TaskSpec],
        group_size: int,
        params: SamplingParams,
        max_tokens: int | None,
    ) -> list[Trajectory]:
        return self.rollout.collect(specs, group_size, params, max_tokens=max_tokens)

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


def sampler_envs(config: Config) -> list[gym.Env]:
    """The environments an in-process sampler plays in: tasks_per_step x group_size of
    them (none with Ray: the workers make their own)."""
    if config.distributed.backend == "ray":
        return []
    g, run = config.grpo, config.run
    return [make_env(run.env, **run.env_kwargs) for _ in range(g.tasks_per_step * g.group_size)]


def make_sampler(
    config: Config,
    envs: list[gym.Env],
    policy: Policy,
    tokenizer: PreTrainedTokenizerBase,
    start_model: str | None,
    weights: WeightSource,
) -> Sampler:
    """The run's sampler: `distributed.backend: ray` starts Ray workers that load
    `start_model` and then `weights()`; otherwise `policy` plays in `envs`
    (`sampler_envs`; the sampler closes them)."""
    if config.distributed.backend == "ray":
        return RaySampler(RayRollout(config, start_model, weights()))
    return InProcessSampler(envs, policy, tokenizer)
