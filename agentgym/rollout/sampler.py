"""The `Sampler` protocol: task specs in, finished trajectories out, whatever plays them.

The training loop submits a step's episodes (`Submission`), polls for the finished
trajectories and, after each learner step, hands the sampler the new weights
with their version number. A sampler only schedules and places: when and where the
episodes are played (in this process, `InProcessSampler`; ahead of the learner,
`agentgym.rollout.ahead`; on Ray workers or torchrun ranks, `agentgym.scale.samplers`).
How they are played is its `Player`'s (`agentgym.rollout.player`): the turn loop, an
agent program, a user's own. Submit and poll are separate so that a sampler can keep
playing while the learner steps; the ones here play what was submitted when polled
with `wait`, and nothing meanwhile.

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

from agentgym import records
from agentgym.policy.base import Policy, as_policy
from agentgym.policy.hf import merged_adapters
from agentgym.rollout.player import Player, Submission, Versions
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

    @property
    def policy(self) -> Policy | None:
        """The policy it plays with in this process; None where it plays elsewhere (Ray)."""
        ...

    def submit(self, submission: Submission) -> None:
        """Queues the submission's episodes."""
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
        """Frees what it holds (environments, workers, its player)."""
        ...


def stamp_version(trajectory: Trajectory, version: int) -> Trajectory:
    """`trajectory` with `version` on each sampled token and -1 on the others."""
    versions = tuple(version if m else -1 for m in trajectory.loss_mask)
    return dataclasses.replace(trajectory, token_versions=versions)


def play_merged(
    player: Player,
    policy: Policy,
    envs: Sequence[gym.Env],
    submission: Submission,
    versions: Versions | None = None,
) -> list[Trajectory]:
    """`player.play` with a LoRA policy's adapters merged into its model while it samples
    (one matrix per layer instead of three): what a Ray worker and a torchrun rank run."""
    policy = as_policy(policy)
    with merged_adapters(policy.model):
        return player.play(policy, envs, submission, versions)


class QueuedSampler:
    """The `Sampler` bookkeeping of the samplers that play what was submitted when polled:
    the queue, the version stamp. A subclass says how one submission is played (`_play`)."""

    policy: Policy | None = None

    def __init__(self) -> None:
        self.version = 0
        self._queued: list[Submission] = []

    def submit(self, submission: Submission) -> None:
        self._queued.append(submission)

    def poll(self, wait: bool = True) -> list[Trajectory]:
        """With `wait`, plays everything submitted and returns it; without, returns what
        has finished without playing more: nothing, since these play only when waited on."""
        finished: list[Trajectory] = []
        if not wait:
            return finished
        queued, self._queued = self._queued, []
        for submission in queued:
            played = self._play(submission)
            finished += [t if t.token_versions else stamp_version(t, self.version) for t in played]
        return finished

    def _play(self, submission: Submission) -> list[Trajectory]:
        raise NotImplementedError


class InProcessSampler(QueuedSampler):
    """Plays episodes in this process: `player` plays them with `policy` in `envs`.

    Args:
        envs: At least tasks_per_step x group_size environments, one per episode.
        policy: The policy; with its own in-process model (transformers), LoRA
            adapters are merged into it while it samples.
        player: Who plays the episodes (`agentgym.rollout.player`); the sampler closes it.
        copies_weights: Whether `policy` samples with its own copy of the learner's
            weights (a vLLM engine, rank 0's whole copy of a sharded learner), which
            `load_weights` then refreshes; False when it samples with the learner's model.
    """

    policy: Policy

    def __init__(
        self,
        envs: Sequence[gym.Env],
        policy: Policy,
        player: Player,
        *,
        copies_weights: bool = False,
    ) -> None:
        super().__init__()
        self.envs = list(envs)
        self.policy = as_policy(policy)
        self.player = player
        self.copies_weights = copies_weights
        self.turn_version: Versions | None = None
        """Called before each turn (partial rollouts, `AheadSampler`): the turn's version."""
        self._merged: contextlib.ExitStack | None = None

    def _play(self, submission: Submission) -> list[Trajectory]:
        """The player's play, holding the merged adapters' context, which `load_weights`
        reopens when it comes between two turns (partial rollouts)."""
        self._merged = contextlib.ExitStack()
        self._merged.enter_context(merged_adapters(self.policy.model))
        try:
            versions = self.turn_version or self.current_version
            return self.player.play(self.policy, self.envs, submission, versions)
        finally:
            merged, self._merged = self._merged, None
            merged.close()

    def current_version(self) -> int:
        """The version it samples with now (what the player records, but for partial
        rollouts, whose `turn_version` may load newer weights first)."""
        return self.version

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
        self.player.close()
        for env in self.envs:
            env.close()
