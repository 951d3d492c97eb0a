"""The `Sampler` protocol: task specs in, finished trajectories out, whatever plays them.

The training loop submits a step's task specs, polls for the finished
trajectories and, after each learner step, hands the sampler the new weights
with their version number. It never asks how the episodes are played: in this
process (`InProcessSampler`), on Ray workers (`agentgym.scale.samplers`), and,
later, asynchronously or through an agent program behind an OpenAI-compatible
endpoint. Submit and poll are separate so that such samplers can keep playing
while the learner steps; the two here play what was submitted when polled with
`wait`, and nothing meanwhile.

A sampler owns the weights it samples with: `load_weights` is the one path by
which the learner's new weights reach it. One that samples with the learner's own
model (transformers in this process) has nothing to copy and only records the version.

Every sampled token records the policy version that sampled it
(`Trajectory.token_versions`, -1 for prompt and environment tokens).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import gymnasium as gym
import torch
from transformers import PreTrainedTokenizerBase

from agentgym import records
from agentgym.policy.base import Policy, SamplingParams, as_policy
from agentgym.policy.hf import merged_adapters
from agentgym.rollout.episodes import TaskSpec, TurnBatching, collect
from agentgym.types import Trajectory

WeightSource = Callable[[], Iterable[tuple[str, torch.Tensor]]]
"""Gives the learner's trainable weights by name, when called; a sampler that needs no
copy (it samples with the learner's own model) never calls it."""


class Sampler(Protocol):
    """Plays G episodes of each submitted task with the current policy."""

    @property
    def version(self) -> int:
        """The policy version it samples with now (0: the weights the run started from)."""
        ...

    def submit(
        self,
        specs: Sequence[TaskSpec],
        group_size: int,
        params: SamplingParams,
        max_tokens: int | None = None,
    ) -> None:
        """Queues `group_size` episodes of each spec, sampled with `params`."""
        ...

    def poll(self, wait: bool = True) -> list[Trajectory]:
        """The trajectories finished since the last poll, grouped by task in the order
        submitted (`group` numbers the task within its submission); with `wait`, all
        that were submitted."""
        ...

    def load_weights(self, weights: WeightSource, version: int) -> dict[str, float | str]:
        """Samples with the learner's weights of `version` from now on; returns the
        sync's metrics (seconds, path), empty when there was nothing to copy."""
        ...

    def close(self) -> None:
        """Frees what it holds (environments, workers)."""
        ...


def stamp_version(trajectory: Trajectory, version: int) -> Trajectory:
    """`trajectory` with `version` on each sampled token and -1 on the others."""
    versions = tuple(version if m else -1 for m in trajectory.loss_mask)
    return dataclasses.replace(trajectory, token_versions=versions)


def play(
    envs: Sequence[gym.Env],
    specs: Sequence[TaskSpec],
    group_size: int,
    policy: Policy,
    tokenizer: PreTrainedTokenizerBase,
    params: SamplingParams,
    max_tokens: int | None = None,
    env_timeout_s: float | None = None,
    env_workers: int | None = None,
    turn_batching: TurnBatching = "barrier",
) -> list[Trajectory]:
    """`collect` with a LoRA policy's adapters merged into its model while it samples (one
    matrix per layer instead of three); what an in-process sampler and a Ray worker run."""
    policy = as_policy(policy)
    with merged_adapters(policy.model):
        return collect(
            envs,
            specs,
            group_size,
            policy,
            tokenizer,
            params,
            max_tokens,
            env_timeout_s,
            env_workers,
            turn_batching=turn_batching,
        )


class QueuedSampler:
    """The `Sampler` bookkeeping of the samplers that play what was submitted when polled:
    the queue, the version stamp. A subclass says how one submission is played (`_play`)."""

    def __init__(self) -> None:
        self.version = 0
        self._queued: list[tuple[Sequence[TaskSpec], int, SamplingParams, int | None]] = []

    def submit(
        self,
        specs: Sequence[TaskSpec],
        group_size: int,
        params: SamplingParams,
        max_tokens: int | None = None,
    ) -> None:
        self._queued.append((specs, group_size, params, max_tokens))

    def poll(self, wait: bool = True) -> list[Trajectory]:
        """With `wait`, plays everything submitted and returns it; without, returns what
        has finished without playing more: nothing, since these play only when waited on."""
        finished: list[Trajectory] = []
        if not wait:
            return finished
        queued, self._queued = self._queued, []
        for specs, group_size, params, max_tokens in queued:
            played = self._play(specs, group_size, params, max_tokens)
            finished += [t if t.token_versions else stamp_version(t, self.version) for t in played]
        return finished

    def _play(
        self,
        specs: Sequence[TaskSpec],
        group_size: int,
        params: SamplingParams,
        max_tokens: int | None,
    ) -> list[Trajectory]:
        raise NotImplementedError


class InProcessSampler(QueuedSampler):
    """Plays episodes in this process: `policy` samples, `envs` answer (G per task).

    Args:
        envs: At least tasks_per_step x group_size environments, one per episode.
        policy: The policy; with its own in-process model (transformers), LoRA
            adapters are merged into it while it samples.
        tokenizer: The policy's tokenizer.
        env_timeout_s: Seconds an environment's `reset` or `step` may take before its
            episode is given up as unscorable (`run.env_step_timeout_s`); None: no limit.
        env_workers: Threads that call the environments at once (`run.env_workers`).
        turn_batching: How turns share the decode batch (`run.turn_batching`).
        copies_weights: Whether `policy` samples with its own copy of the learner's
            weights (a vLLM engine, rank 0's whole copy of a sharded learner), which
            `load_weights` then refreshes; False when it samples with the learner's model.
    """

    def __init__(
        self,
        envs: Sequence[gym.Env],
        policy: Policy,
        tokenizer: PreTrainedTokenizerBase,
        env_timeout_s: float | None = None,
        *,
        env_workers: int | None = None,
        turn_batching: TurnBatching = "barrier",
        copies_weights: bool = False,
    ) -> None:
        super().__init__()
        self.envs = list(envs)
        self.policy = as_policy(policy)
        self.tokenizer = tokenizer
        self.env_timeout_s, self.env_workers = env_timeout_s, env_workers
        self.turn_batching = turn_batching
        self.copies_weights = copies_weights
        self.turn_version: Callable[[], int] | None = None
        """Called before each turn (partial rollouts, `AheadSampler`): the turn's version."""
        self._merged: contextlib.ExitStack | None = None

    def _play(
        self,
        specs: Sequence[TaskSpec],
        group_size: int,
        params: SamplingParams,
        max_tokens: int | None,
    ) -> list[Trajectory]:
        """`play`, holding the merged adapters' context, which `load_weights` reopens when it
        comes between two turns (partial rollouts)."""
        self._merged = contextlib.ExitStack()
        self._merged.enter_context(merged_adapters(self.policy.model))
        try:
            return collect(
                self.envs,
                specs,
                group_size,
                self.policy,
                self.tokenizer,
                params,
                max_tokens,
                self.env_timeout_s,
                self.env_workers,
                self.turn_version,
                self.turn_batching,
            )
        finally:
            merged, self._merged = self._merged, None
            merged.close()

    def load_weights(self, weights: WeightSource, version: int) -> dict[str, float | str]:
        """Copies `weights()` into the policy when it samples with its own copy of them,
        timed as `rollout/weight_sync_seconds`; records the version either way."""
        self.version = version
        if not self.copies_weights:
            return {}
        start = time.perf_counter()
        merged = self._merged
        if merged is not None:  # between two turns: the old adapters out, the new ones in
            merged.close()
        self.policy.load_weights(weights())
        if merged is not None:
            self._merged = contextlib.ExitStack()
            self._merged.enter_context(merged_adapters(self.policy.model))
        return {records.WEIGHT_SYNC_SECONDS: time.perf_counter() - start}

    def close(self) -> None:
        for env in self.envs:
            env.close()
