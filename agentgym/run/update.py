"""The learner's part of a GRPO step: from the step's trajectories to its update.

The batch is built from the trajectories (groups whose rewards are all equal
left out when asked, truncated episodes masked when asked), corrected for a
vLLM sampler's logprob mismatch, and stepped on `grpo.num_iterations` times,
on every torchrun rank (`agentgym.scale.dist.share_step`).
"""

from __future__ import annotations

import torch

from agentgym import records
from agentgym.config import Config
from agentgym.learn import grpo
from agentgym.learn.learner import Learner
from agentgym.scale import dist
from agentgym.types import Batch, Trajectory


def learner_steps(
    config: Config,
    learner: Learner,
    trajectories: list[Trajectory],
    rewards: torch.Tensor,
    advantages: torch.Tensor,
    tokenizer,
    beta: float | None,
) -> dict[str, float]:
    """`grpo.num_iterations` learner steps on the step's batch; returns their mean metrics.

    Groups whose rewards are all equal are left out first with
    `grpo.drop_zero_variance_groups`, and episodes cut at the token budget are
    masked out of the loss with `grpo.mask_truncated_completions`. Later
    iterations compare against the same stored old logprobs: the sampler's, or, with
    a vLLM sampler, the learner's own, recomputed first, with truncated importance
    weights for the sampler's (`Learner.correct_mismatch`).
    """
    g = config.grpo
    # an episode whose reset failed has no tokens to learn from (its advantage is 0)
    keep = torch.tensor([len(t.tokens) > 0 for t in trajectories], dtype=torch.bool)
    stats: dict[str, float] = {}
    if g.drop_zero_variance_groups:
        flat = torch.tensor(
            [
                grpo.zero_variance_fraction(group, g.group_size) == 1.0
                for group in rewards.split(g.group_size)
            ]
        )
        keep &= ~flat.repeat_interleave(g.group_size)
        stats[records.DROPPED_GROUPS] = float(flat.sum())
    if not keep.any():
        return stats
    kept = [t for t, k in zip(trajectories, keep.tolist(), strict=True) if k]
    batch = Batch.from_trajectories(kept, advantages[keep], tokenizer.pad_token_id)
    if g.mask_truncated_completions:
        complete = torch.tensor([not t.truncated for t in kept], dtype=batch.loss_mask.dtype)
        batch = batch.masked_rows(complete)
    if config.policy.backend == "vllm":
        batch, mismatch = learner.correct_mismatch(batch)
        stats.update(mismatch)
    runs = [dist.share_step(learner, batch, beta) for _ in range(g.num_iterations)]
    stats.update({key: sum(r[key] for r in runs) / len(runs) for key in runs[0]})
    return stats
