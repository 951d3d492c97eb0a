"""Sampling ahead of the learner: asynchronous GRPO with bounded staleness.

`AheadSampler` wraps a sampler that holds its own copy of the weights (an in-process
transformers copy, Ray workers) and plays each submission on a thread of its own, so the
next steps' episodes are played while the learner steps on this one's. With k =
`pipeline.max_off_policy_steps`, the submission for GRPO step t is played with the
weights of version max(first, t - 1 - k): the thread waits for that version when the
learner has not made it yet, and keeps newer ones for the submissions after. So the
versions, and with them the run, do not depend on timing: a seed gives the same run.
k = 0 would play each step with the weights of the step before, as the synchronous loop
does, which does not need this class (the loop does not wrap then).

Weights handed over by `load_weights` are copied at once (the learner goes on changing its
own in place) and put into the wrapped sampler, by its own `load_weights`, on the thread,
between two submissions: an episode is played with one version from its start to its end.
With partial rollouts, the newest weights the step being played may use (up to version
step - 1) also go in before each turn (`InProcessSampler.turn_version`), so an episode may
mix versions, each token recording its own; which turn takes them depends on timing.

A checkpoint holds the weights the steps handed ahead are to be played with (`kept`):
version max(first, s - k) up to s - 1 at step s, which the sampler keeps (`start` is the
first of them); a resumed run puts them back (`agentgym.run.setup`), so the steps drawn again
are played with the very weights the uninterrupted run played them with, and the run goes
on bitwise. That costs up to k copies of the trained weights (adapters, with LoRA).

An evaluation that uses the wrapped sampler's own policy (an in-process vLLM engine, which
holds one set of weights) holds the thread between two submissions (`paused`): it puts the
learner's weights in, evaluates, and the block's end puts back the weights the next
submission is to be played with (from those kept), as the thread would have before it.

`stale_groups` is the check the loop makes before training a batch: groups whose oldest
sampled token is more than k versions behind are dropped and counted
(`async/dropped_groups`); under the rule above none is, but a sampler that plays by other
rules (or a resumed run's replay) is held to it all the same.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import torch

from agentgym import faults, records
from agentgym.policy.base import Policy
from agentgym.rollout.player import Submission
from agentgym.rollout.sampler import InProcessSampler, Sampler, WeightSource
from agentgym.types import StepRecord, TrainingError, Trajectory

Weights = list[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class _Queued:
    """A submission and the GRPO step it is for."""

    step: int
    submission: Submission


class AheadSampler:
    """Plays submissions on a thread, each with the weights of version
    max(`first`, step - 1 - `max_off_policy_steps`) (see the module's docstring).

    Args:
        inner: A sampler with its own copy of the weights (`load_weights` refreshes it).
        max_off_policy_steps: k >= 1.
        first_step: The GRPO step the first submission is for (a resumed run's next step);
            `inner` holds the weights of version `first_step - 1`.
        partial_rollouts: Newer weights go in between turns too (`inner` must play turn by
            turn in this process: an `InProcessSampler`).
        start: The weights `inner` holds now (of version `inner.version`), kept for a
            checkpoint to hold (`kept`); None: not kept.
    """

    def __init__(
        self,
        inner: Sampler,
        max_off_policy_steps: int,
        first_step: int = 1,
        partial_rollouts: bool = False,
        start: WeightSource | None = None,
    ) -> None:
        if max_off_policy_steps < 1:
            raise ValueError(f"max_off_policy_steps must be >= 1, got {max_off_policy_steps}")
        self.inner = inner
        self.k = max_off_policy_steps
        self._next_step = self._playing = first_step
        if partial_rollouts:
            if not isinstance(inner, InProcessSampler):
                raise ValueError(
                    f"partial rollouts need a sampler that plays turn by turn in this process; "
                    f"{type(inner).__name__} does not"
                )
            inner.turn_version = self._turn_version
        self._cond = threading.Condition()
        self._todo: deque[_Queued] = deque()
        self._done: deque[list[Trajectory] | BaseException] = deque()
        self._weights: dict[int, Weights] = {}
        self._first = inner.version
        self._kept: dict[int, Weights] = {} if start is None else {self._first: _copy(start)}
        self._closed = False
        self._paused = self._busy = False
        self._thread = threading.Thread(target=self._work, name="agentgym-sampler", daemon=True)
        self._thread.start()

    @property
    def version(self) -> int:
        """The version the thread samples with now."""
        return self.inner.version

    @property
    def policy(self) -> Policy | None:
        """The wrapped sampler's policy, where it plays in this process (else None)."""
        return self.inner.policy

    def submit(self, submission: Submission) -> None:
        """Queues the next step's episodes; the thread plays them when their version is there."""
        with self._cond:
            self._todo.append(_Queued(self._next_step, submission))
            self._next_step += 1
            self._cond.notify_all()

    def poll(self, wait: bool = True) -> list[Trajectory]:
        """The earliest submission's trajectories not returned yet (with `wait`, waiting for
        them); without `wait`, those of every submission finished since the last poll. An
        error the thread met playing a submission is raised here."""
        with self._cond:
            if wait:
                self._cond.wait_for(lambda: bool(self._done) or not self._thread.is_alive())
            results = [self._done.popleft()] if wait and self._done else []
            while not wait and self._done:
                results.append(self._done.popleft())
        finished: list[Trajectory] = []
        for result in results:
            if isinstance(result, BaseException):
                raise result
            finished += result
        return finished

    def load_weights(self, weights: WeightSource, version: int) -> dict[str, float | str]:
        """Copies `weights()` now; the thread puts them into the wrapped sampler before the
        first submission that is to be played with `version`. Returns the copy's seconds."""
        start = time.perf_counter()
        copied = _copy(weights)
        with self._cond:
            self._weights[version] = copied
            self._cond.notify_all()
        if self._kept:
            oldest = max(self._first, version - self.k)
            self._kept = {v: w for v, w in self._kept.items() if v >= oldest}
            self._kept[version] = copied
        return {records.WEIGHT_SYNC_SECONDS: time.perf_counter() - start}

    def kept(self, step: int) -> dict[int, Weights]:
        """The weights that the steps after `step` (handed ahead or not yet) are to be played
        with, older than `step`'s own: versions max(first, step - k) to step - 1, by version.
        Empty when they were not kept (no `start`)."""
        if not self._kept:
            return {}
        wanted = range(max(self._first, step - self.k), step)
        missing = [v for v in wanted if v not in self._kept]
        assert not missing, f"versions {missing} were not kept"  # handed over in order
        return {v: self._kept[v] for v in wanted}

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Holds the thread for the block: it finishes the submission it plays and starts no
        other. The block may load any weights into the wrapped sampler's policy; its end puts
        back those the next submission is to be played with (kept: `start` was given),
        unless they are yet to be handed over (the thread loads them then)."""
        with self._cond:
            assert not self._paused, "paused() does not nest"
            self._paused = True
            self._cond.wait_for(lambda: not self._busy)
        try:
            yield
        finally:
            with self._cond:
                step = self._todo[0].step if self._todo else self._next_step
                version = self._version_for(step)
                weights = self._take(version) or self._kept.get(version)
                if weights is not None:
                    self.inner.load_weights(_source(weights), version)
                elif version == self.inner.version:  # not handed over yet: loaded when it is
                    raise RuntimeError(f"the weights of version {version} were not kept")
                self._paused = False
                self._cond.notify_all()

    def close(self) -> None:
        """Stops the thread after the submission it is playing, then closes the wrapped one."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        self.inner.close()

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or (not self._paused and self._ready()))
                if self._closed:
                    return
                job, self._busy = self._todo[0], True
                self._playing = job.step
                version = self._version_for(job.step)
                weights = self._take(version)
            try:
                faults.reached("rollout", job.step)
                if weights is not None:
                    self.inner.load_weights(_source(weights), version)
                self.inner.submit(job.submission)
                result: list[Trajectory] | BaseException = self.inner.poll(wait=True)
            except BaseException as err:  # raised again by the poll that asks for it
                result = err
            with self._cond:
                self._todo.popleft()
                self._done.append(result)
                self._busy = False
                self._cond.notify_all()

    def _turn_version(self) -> int:
        """Partial rollouts, before each turn on the thread: the newest weights handed over
        that the step being played may sample with (up to version step - 1) go in first."""
        with self._cond:
            usable = [v for v in self._weights if self.inner.version < v < self._playing]
            newest = max(usable, default=None)
            weights = self._take(newest) if newest is not None else None
        if weights is not None and newest is not None:
            self.inner.load_weights(_source(weights), newest)
        return self.inner.version

    def _take(self, version: int) -> Weights | None:
        """The weights of `version` if handed over (None: not), and forgets those older:
        no submission will be played with them. Called holding the condition's lock."""
        for old in [v for v in self._weights if v < version]:
            del self._weights[old]
        return self._weights.pop(version, None)

    def _version_for(self, step: int) -> int:
        return max(self.inner.version, step - 1 - self.k)

    def _ready(self) -> bool:
        """The next submission can be played: its version is held or has been handed over."""
        if not self._todo:
            return False
        version = self._version_for(self._todo[0].step)
        return version == self.inner.version or version in self._weights


def _copy(weights: WeightSource) -> Weights:
    return [(name, tensor.detach().clone()) for name, tensor in weights()]


def _source(weights: Weights) -> WeightSource:
    return lambda: weights


def staleness(trajectory: Trajectory, version: int) -> int:
    """How many versions the oldest sampled token of `trajectory` is behind `version`
    (0 for one with no sampled token)."""
    sampled = [v for v in trajectory.token_versions if v >= 0]
    return version - min(sampled) if sampled else 0


def stale_groups(
    trajectories: Sequence[Trajectory], group_size: int, version: int, limit: int
) -> list[int]:
    """The indexes of the groups (G contiguous trajectories each) with a trajectory more than
    `limit` versions behind `version`."""
    return [
        start // group_size
        for start in range(0, len(trajectories), group_size)
        if any(staleness(t, version) > limit for t in trajectories[start : start + group_size])
    ]


def drop_stale(record: StepRecord, group_size: int, limit: int) -> StepRecord:
    """`record` less its groups more than `limit` versions behind `record.version`, with the
    pipeline's figures: the trained episodes' staleness (mean, max) and the groups dropped.
    TrainingError when every group is."""
    stale = set(stale_groups(record.trajectories, group_size, record.version, limit))
    if stale and len(stale) == len(record.specs):
        raise TrainingError(
            f"step {record.step}: every group was sampled more than {limit} versions before "
            f"version {record.version} (pipeline.max_off_policy_steps); nothing to train on"
        )
    kept = tuple(t for i, t in enumerate(record.trajectories) if i // group_size not in stale)
    ages = [staleness(t, record.version) for t in kept]
    figures = {
        records.STALENESS_MEAN: sum(ages) / len(ages),
        records.STALENESS_MAX: float(max(ages)),
        records.STALE_GROUPS: float(len(stale)),
    }
    specs = tuple(s for i, s in enumerate(record.specs) if i not in stale)
    return replace(record, specs=specs, trajectories=kept, pipeline=figures)
