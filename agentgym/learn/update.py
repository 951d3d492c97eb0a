"""The `update` stage of a training step: from the step's advantages to the learner's update.

The batch is built from the trajectories (groups whose rewards are all equal left out
when asked, truncated episodes masked when asked), corrected for a vLLM sampler's
logprob mismatch, and stepped on `grpo.num_iterations` times by `step`: the learner's
own, or, under torchrun, rank 0's that every rank takes part in
(`agentgym.scale.ranks.share_step`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from agentgym import records
from agentgym.config import Config
from agentgym.learn.advantages import with_split_samples
from agentgym.learn.learner import Learner
from agentgym.types import Batch, StepRecord

LearnerStep = Callable[[Learner, Batch, float | None], dict[str, float]]
"""Takes one optimizer step of the learner on a batch with a KL coefficient; its metrics."""


def own_step(learner: Learner, batch: Batch, beta: float | None) -> dict[str, float]:
    """The learner's step in this process alone."""
    return learner.step(batch, beta=beta)


def update(
    record: StepRecord,
    learner: Learner,
    config: Config,
    pad_id: int,
    beta: float | None = None,
    step: LearnerStep = own_step,
    off_policy: bool = False,
) -> StepRecord:
    """`record` with its `stats`: the means of `grpo.num_iterations` learner steps on its batch.

    Groups whose rewards are all equal (`record.flat_groups`) are left out first with
    `grpo.drop_zero_variance_groups`, and episodes cut at the token budget are masked
    out of the loss with `grpo.mask_truncated_completions`. Later iterations compare
    against the same stored old logprobs: the sampler's, or, `off_policy` (a vLLM sampler
    or asynchronous GRPO, `pipeline.max_off_policy_steps` > 0: `Trainer.off_policy`), the
    learner's own, recomputed first, with truncated importance weights for the sampler's
    (`Learner.correct_mismatch`). Asynchronously that is the decoupled objective (AReaL,
    Fu et al. 2025, arXiv:2505.24298): the clip is taken around the weights being
    updated, not the older ones that sampled, whose distance the weights correct.
    `beta` is the step's KL coefficient (None: the learner's). A step with no row left
    takes no learner step.
    """
    record.require("advantages", "flat_groups")
    assert record.advantages is not None and record.flat_groups is not None
    g, trajectories = config.grpo, record.trajectories
    # an episode whose reset failed has no tokens to learn from (its advantage is 0)
    keep = torch.tensor([len(t.tokens) > 0 for t in trajectories], dtype=torch.bool)
    stats: dict[str, float] = {}
    if g.drop_zero_variance_groups:
        keep &= ~record.flat_groups.repeat_interleave(g.group_size)
        stats[records.DROPPED_GROUPS] = float(record.flat_groups.sum())
    if not keep.any():
        return replace(record, stats=stats)
    kept = [t for t, k in zip(trajectories, keep.tolist(), strict=True) if k]
    kept, kept_advantages = with_split_samples(
        kept, record.advantages[keep], _kept_split(record, keep)
    )
    batch = Batch.from_trajectories(kept, kept_advantages, pad_id)
    if g.mask_truncated_completions:
        complete = torch.tensor([not t.truncated for t in kept], dtype=batch.loss_mask.dtype)
        batch = batch.masked_rows(complete)
    if off_policy:
        batch, mismatch = learner.correct_mismatch(batch)
        stats.update(mismatch)
    runs = [step(learner, batch, beta) for _ in range(g.num_iterations)]
    stats.update({key: sum(r[key] for r in runs) / len(runs) for key in runs[0]})
    return replace(record, stats=stats)


def _kept_split(record: StepRecord, keep: torch.Tensor) -> torch.Tensor | None:
    """The rows of `record.split_advantages` that belong to the kept trajectories."""
    if record.split_advantages is None:
        return None
    owners = [i for i, t in enumerate(record.trajectories) for _ in t.split_samples]
    rows = [row for row, i in enumerate(owners) if keep[i]]
    return record.split_advantages[rows]
