"""GRPO advantages and policy losses, as pure tensor functions.

What this implements, against GRPO as published (Shao et al. 2024,
"DeepSeekMath", arXiv:2402.03300, outcome supervision, Sec. 4.1), option by
option (the config's `grpo` section names them as TRL does):

- Advantages (`scale_rewards`) are the paper's group-normalised outcome
  rewards, (r - group mean) / group std, one scalar per trajectory, broadcast
  to every token it sampled ("group"). The std is the *population* std
  (divide by G), as in the tutorial's rollout code; `std="unbiased"` divides
  by G - 1, as TRL does (docs/losses.md). "batch" divides by the
  std of the whole batch's rewards instead (REINFORCE++, Hu et al. 2025,
  arXiv:2501.03262; TRL's `scale_rewards="batch"`), "none" not at all (Dr.
  GRPO, Liu et al. 2025, arXiv:2503.20783). Departures: an unscorable
  sample (`scorable` False, or a reward of NaN: a reward function or the
  environment failed on it) gets advantage 0 and is left out of its group's
  statistics and of the batch std, and a group whose rewards are all equal
  gets 0 everywhere instead of rounding noise divided by eps.
- The loss "grpo" is the paper's: the PPO clipped surrogate plus beta times
  the per-token k3 KL estimate to the reference policy (Schulman 2020,
  "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html; the
  paper's Eq. 4), averaged over each sequence's tokens, then over sequences.
  Departures: only tokens the policy sampled count (`loss_mask`; tool and
  environment tokens of multi-turn episodes are 0), so |o_i| is the number
  of sampled tokens; `old_logprobs` are whatever the learner passes (in this
  project, the sampler's), so the ratio also absorbs sampler/trainer
  numerical mismatch; log-ratios are clamped to +-20 so exp cannot overflow.
- "bnpo" is a token mean over each micro-batch, micro-batches weighted by
  their sequences (TRL's `bnpo`, equal to it for equal micro-batches).
- "dapo" is DAPO's token-level loss (Yu et al. 2025, arXiv:2503.14476,
  Sec. 3.3): sum over all sampled tokens of the whole batch / their count, so
  long answers are not down-weighted ("token_mean" is its older name here).
  `epsilon_high` is DAPO's clip-higher (Sec. 3.1). DAPO's overlong filtering
  is `mask_truncated_completions` (Sec. 3.4: episodes cut at the token budget
  leave the loss). Its dynamic sampling (Sec. 3.2) is approximated by
  `drop_zero_variance_groups`, which drops groups with equal rewards rather
  than sampling more; `zero_variance_fraction` measures them either way.
- "dr_grpo" sums each sequence's token losses and divides by a constant,
  the most tokens an episode may hold (`sampling.max_episode_tokens`; the
  paper's generation budget), then averages over sequences (Dr. GRPO).
- `importance_sampling_level="sequence"` is GSPO's ratio (Zheng et al. 2025,
  arXiv:2507.18071): the exp of the mean token log-ratio of the sequence,
  clipped once for all its tokens, as TRL computes it.
- `kl_estimator`: "k3" (the paper's, unbiased and >= 0) or "k1", the plain
  log-ratio (Schulman 2020); `beta = 0` drops the term and the reference model.
- `num_iterations` (the paper's mu, Algorithm 1) takes mu optimizer steps on
  each batch; every step compares with the same stored old logprobs, so the
  clip bites from the second step on.
- No dual clip: for a negative advantage the loss grows with the ratio
  without bound, as in PPO and the paper.
- With a sampler other than the learner (vLLM), the learner recomputes the
  old logprobs itself before the update, and each token's clipped surrogate
  is multiplied by the truncated importance weight min(exp(learner old -
  sampler), cap) (`truncated_is_weights`; Yao et al. 2025, "Your Efficient RL
  Framework Secretly Brings You Off-Policy RL Training", as verl's and
  slime's TIS), which corrects for the sampler's different numerics; the KL
  term is not weighted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Literal, get_args

import torch
from torch import Tensor

# The registry moved to agentgym.learn.losses; its names stay importable from here.
from agentgym.learn.losses import LOSSES as LOSSES
from agentgym.learn.losses import MICRO_BATCH_WEIGHTS as MICRO_BATCH_WEIGHTS
from agentgym.learn.losses import POLICY_LOSSES as POLICY_LOSSES
from agentgym.learn.losses import LossOutput, register_policy_loss
from agentgym.learn.losses import PolicyLossFn as PolicyLossFn
from agentgym.learn.losses import RegisteredLoss as RegisteredLoss
from agentgym.learn.losses import get_policy_loss as get_policy_loss
from agentgym.types import TrainingError

Aggregation = Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)
_MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: far beyond any clip, far from float32 overflow


Scale = Literal["group", "batch", "none"]


def check_groups(task_ids: Sequence[str], groups: Sequence[int], group_size: int) -> None:
    """Checks that a step's samples come as the contiguous groups `group_advantages` reads.

    `group_advantages` takes every `group_size` consecutive rewards for one group
    (`view(-1, G)`): samples reordered on the way from the sampler would be compared with
    another task's, silently. So each block of G must share one task id and one group
    index, and no two blocks one group index (two groups may draw the same task).

    Args:
        task_ids: [N] each sample's task id (`Trajectory.task_id`), in batch order.
        groups: [N] each sample's group index within its step (`Trajectory.group`).
        group_size: G, the samples per group.

    Raises:
        TrainingError: naming the first block that breaks this (its index, its samples,
            the task ids and group indices in it), or when N is not a multiple of G.
    """
    n = len(task_ids)
    if len(groups) != n or group_size < 1 or n % group_size != 0:
        raise TrainingError(
            f"{n} task ids and {len(groups)} group indices cannot be split into groups of "
            f"{group_size}: the sampler must return G samples of each task"
        )
    seen: dict[int, int] = {}  # group index -> the block that had it
    for block, start in enumerate(range(0, n, group_size)):
        ids = list(dict.fromkeys(task_ids[start : start + group_size]))
        indices = list(dict.fromkeys(groups[start : start + group_size]))
        if len(ids) != 1 or len(indices) != 1 or indices[0] in seen:
            again = f" (block {seen[indices[0]]} has it too)" if indices[0] in seen else ""
            raise TrainingError(
                f"block {block} (samples {start}-{start + group_size - 1}) is not one group: "
                f"task ids {ids}, group indices {indices}{again}; each group's "
                f"{group_size} samples must be contiguous"
            )
        seen[indices[0]] = block


def group_advantages(
    rewards: Tensor,
    group_size: int,
    eps: float = 1e-8,
    *,
    scale: Scale = "group",
    scorable: Tensor | None = None,
    unbiased: bool = False,
) -> Tensor:
    """Group-relative advantage of each trajectory: (r - group mean) / (group std + eps).

    Args:
        rewards: [N] rewards, the G samples of each prompt contiguous (which nothing
            here can see: `check_groups` checks it on the samples). NaN marks an
            unscorable sample: its advantage is 0 and it is left out of the group's
            mean and std.
        group_size: G, the samples per prompt.
        eps: added to the std, as in the paper.
        scale: What divides r - group mean: the group's std ("group", the paper),
            the std of the whole batch's rewards ("batch", as Hu et al. 2025,
            REINFORCE++, and TRL's `scale_rewards="batch"`), or nothing ("none", Dr. GRPO).
        scorable: [N] bool, False on unscorable samples, which are treated as NaN
            rewards are (left out of every statistic, the batch std too); None: all are.
        unbiased: The std divides by n - 1 (TRL's) rather than n, the scored samples.

    Returns:
        [N] advantages (float). A group whose scored rewards are all equal (or that has
        fewer than two) gets 0 throughout.

    Raises:
        ValueError: if `rewards` is not [N], N is not a multiple of G, or `scorable`
            is given and not [N].
    """
    groups, valid = grouped(rewards, group_size, scorable)
    # min=1 keeps 0/0 out of empty groups; groups of fewer than two scored samples get 0 below
    count = valid.sum(dim=1, keepdim=True).clamp(min=1)
    filled = torch.where(valid, groups, 0.0)
    mean = filled.sum(dim=1, keepdim=True) / count
    centered = torch.where(valid, groups - mean, 0.0)
    if scale not in get_args(Scale):
        raise ValueError(f"scale must be one of {get_args(Scale)}, got {scale!r}")
    std: Tensor | float = 0.0
    if scale == "group":
        n = (count - 1).clamp(min=1) if unbiased else count
        std = (centered.square().sum(dim=1, keepdim=True) / n).sqrt()
    elif scale == "batch":
        scored = groups[valid]
        squares = (scored - scored.mean()).square() if scored.numel() else scored
        variance = squares.sum() / max(scored.numel() - 1, 1) if unbiased else squares.mean()
        std = variance.sqrt() if scored.numel() else 0.0  # none scored: every advantage is 0
    adv = centered if scale == "none" else centered / (std + eps)
    flat = _all_equal(groups, valid).unsqueeze(1)
    return torch.where(valid & ~flat, adv, 0.0).reshape(-1)


def zero_variance_fraction(
    rewards: Tensor, group_size: int, *, scorable: Tensor | None = None
) -> float:
    """Fraction of groups that give no learning signal: their scored rewards all equal.

    `rewards` is [N], groups of `group_size` contiguous; NaN entries and those where
    `scorable` [N] is False are ignored, and a group with fewer than two scored rewards
    counts as zero-variance.
    """
    return flat_groups(rewards, group_size, scorable=scorable).float().mean().item()


def flat_groups(rewards: Tensor, group_size: int, *, scorable: Tensor | None = None) -> Tensor:
    """[N/G] bool: the group's scored rewards are all equal, or fewer than two are scored
    (as `zero_variance_fraction` counts them); it gives no learning signal."""
    return _all_equal(*grouped(rewards, group_size, scorable))


def grouped(
    rewards: Tensor, group_size: int, scorable: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Rewards as [N/G, G] floats and the mask of the scorable, non-NaN ones."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"{rewards.numel()} rewards cannot be split into groups of {group_size}: "
            "N must be a positive multiple of group_size"
        )
    groups = (rewards if rewards.is_floating_point() else rewards.float()).view(-1, group_size)
    valid = ~torch.isnan(groups)
    if scorable is not None:
        if scorable.shape != rewards.shape:
            raise ValueError(
                f"scorable must be [N={rewards.numel()}] like rewards, got {tuple(scorable.shape)}"
            )
        valid = valid & scorable.to(torch.bool).view(-1, group_size)
    return groups, valid


def _all_equal(groups: Tensor, valid: Tensor) -> Tensor:
    """[N/G] bool: the group's scored rewards are all equal (exactly, no tolerance)."""
    high = torch.where(valid, groups, -torch.inf).amax(dim=1)
    low = torch.where(valid, groups, torch.inf).amin(dim=1)
    return (high == low) | (valid.sum(dim=1) < 2)


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(policy || reference), >= 0; shapes [...] in and out.

    With d = ref_logprobs - logprobs on tokens sampled from the policy,
    k3 = exp(d) - d - 1 (Schulman 2020). d is clamped to +-20 against overflow.
    """
    d = (ref_logprobs - logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.exp(d) - d - 1.0


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k1 estimate of KL(policy || reference): logprobs - ref_logprobs.

    Unbiased for the KL but of high variance, and negative on some tokens
    (Schulman 2020); as a loss term its gradient is that of the log-ratio.
    """
    return logprobs - ref_logprobs


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": kl_k1, "k3": kl_k3}


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` [...] where `mask` (same shape, any dtype) is nonzero, over `dim` or all.

    Entries under a zero mask are ignored even if inf or NaN; an empty selection gives 0.
    """
    keep = mask.bool()
    # sum(None) would sum everything too: the `dim is None` cases only spell it out
    total = torch.where(keep, x, 0.0).sum() if dim is None else torch.where(keep, x, 0.0).sum(dim)
    count = keep.sum() if dim is None else keep.sum(dim)
    return total / count.clamp(min=1)


def aggregate(
    per_token: Tensor, mask: Tensor, aggregation: Aggregation, max_tokens: int | None = None
) -> Tensor:
    """Reduces a [B, T] per-token loss to a scalar over the masked tokens.

    "seq_mean_token_mean" (GRPO): mean over each sequence's tokens, then over all B
    sequences (one with no tokens contributes 0). "token_mean" (DAPO, BNPO): sum over
    all tokens / their count. "seq_mean_token_sum_norm" (Dr. GRPO): each sequence's
    sum / `max_tokens` (a constant: the most tokens a completion may have; None: T),
    then mean over sequences.
    """
    if aggregation == "seq_mean_token_mean":
        return masked_mean(per_token, mask, dim=-1).mean()
    if aggregation == "token_mean":
        return masked_mean(per_token, mask)
    if aggregation == "seq_mean_token_sum_norm":
        norm = mask.shape[-1] if max_tokens is None else max_tokens
        return torch.where(mask.bool(), per_token, 0.0).sum(-1).mean() / norm
    raise ValueError(f"unknown aggregation {aggregation!r}; choose one of {AGGREGATIONS}")


def clipped_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    ref_logprobs: Tensor | None = None,
    epsilon: float = 0.2,
    beta: float = 0.0,
    epsilon_high: float | None = None,
    aggregation: Aggregation = "seq_mean_token_mean",
    importance_sampling_level: Literal["token", "sequence"] = "token",
    kl_estimator: Literal["k1", "k3"] = "k3",
    max_tokens: int | None = None,
    is_weights: Tensor | None = None,
) -> LossOutput:
    """PPO/GRPO clipped surrogate plus beta * KL, reduced by `aggregation`.

    Per token: -min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A) + beta * KL,
    with ratio = exp(logprobs - old_logprobs), or, at the "sequence" level (GSPO,
    Zheng et al. 2025, arXiv:2507.18071), the exp of the mean log-ratio of the
    sequence's masked tokens, shared by all of them. Positions where `loss_mask`
    is 0 affect neither the loss nor any gradient, whatever they hold (even inf or NaN).

    Args:
        logprobs: [B, T] current-policy log-probs of the target tokens (requires grad).
        old_logprobs: [B, T] log-probs of the same tokens under the sampling policy.
        advantages: [B, T] one advantage per token (an estimator's, `agentgym.learn.advantages`),
            or [B], one per sequence on every token.
        loss_mask: [B, T] 1 on tokens the policy sampled, 0 elsewhere (any dtype).
        ref_logprobs: [B, T] reference-policy log-probs; required when beta > 0.
        epsilon: lower clip range (and upper, unless epsilon_high is given).
        beta: KL coefficient.
        epsilon_high: DAPO clip-higher upper range; None means epsilon.
        aggregation: see `aggregate`.
        importance_sampling_level: "token" (GRPO, PPO) or "sequence" (GSPO).
        kl_estimator: "k3" (the paper's, >= 0) or "k1" (the log-ratio).
        max_tokens: Dr. GRPO's constant normaliser; see `aggregate`.
        is_weights: [B, T] per-token weights of the clipped surrogate, detached (the
            truncated importance weights of `truncated_is_weights`); None: all 1.

    Raises:
        ValueError: on mismatched shapes, or beta > 0 without ref_logprobs.
    """
    _check_loss_inputs(logprobs, old_logprobs, advantages, loss_mask, ref_logprobs, beta)
    keep = loss_mask.bool()
    # Zero the masked positions *before* any exp, so their gradient is an exact 0, not 0*inf;
    # any finite fill would do (here, for ref and is_weights): every later read uses `keep`.
    logp = torch.where(keep, logprobs, 0.0)
    old = torch.where(keep, old_logprobs.detach(), 0.0)
    log_ratio = (logp - old).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    if importance_sampling_level == "sequence":
        log_ratio = masked_mean(log_ratio, keep, dim=-1).unsqueeze(-1).expand_as(log_ratio)
    elif importance_sampling_level != "token":
        raise ValueError(
            "importance_sampling_level must be 'token' or 'sequence', "
            f"got {importance_sampling_level!r}"
        )
    ratio = torch.exp(log_ratio)
    adv = advantages.detach().to(ratio.dtype)
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv  # [B]: one advantage on every token
    high = epsilon if epsilon_high is None else epsilon_high
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1.0 - epsilon, 1.0 + high) * adv)
    if is_weights is not None:
        per_token = per_token * torch.where(keep, is_weights.detach(), 0.0)
    clipped = ((ratio > 1.0 + high) & (adv > 0)) | ((ratio < 1.0 - epsilon) & (adv < 0))

    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(
            f"kl_estimator must be one of {sorted(KL_ESTIMATORS)}, got {kl_estimator!r}"
        )
    policy_loss = aggregate(per_token, keep, aggregation, max_tokens)
    loss, kl = policy_loss, torch.zeros((), device=logprobs.device)
    if ref_logprobs is not None:
        ref = torch.where(keep, ref_logprobs.detach(), 0.0)
        kl = aggregate(KL_ESTIMATORS[kl_estimator](logp, ref), keep, aggregation, max_tokens)
        if beta > 0:
            loss = policy_loss + beta * kl
    return LossOutput(
        loss=loss,
        policy_loss=policy_loss.detach(),
        kl=kl.detach(),
        clip_fraction=masked_mean(clipped.float(), keep).detach(),
    )


def _check_loss_inputs(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    ref_logprobs: Tensor | None,
    beta: float,
) -> None:
    """ValueError unless the shapes agree and beta > 0 comes with ref_logprobs."""
    if not logprobs.shape == old_logprobs.shape == loss_mask.shape or logprobs.dim() != 2:
        raise ValueError(
            "logprobs, old_logprobs and loss_mask must all be [B, T]; got "
            f"{tuple(logprobs.shape)}, {tuple(old_logprobs.shape)}, {tuple(loss_mask.shape)}"
        )
    if advantages.shape not in (logprobs.shape, logprobs.shape[:1]):
        raise ValueError(
            f"advantages must be [B, T] = {tuple(logprobs.shape)} or [B={logprobs.shape[0]}], "
            f"got {tuple(advantages.shape)}"
        )
    if beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs: pass the reference policy's log-probs")


def truncated_is_weights(
    old_logprobs: Tensor, sampler_logprobs: Tensor, loss_mask: Tensor, cap: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Truncated importance weights between the learner's and the sampler's logprobs.

    w = min(exp(old_logprobs - sampler_logprobs), cap) per token (TIS, as verl and
    slime apply it): the rollout was drawn from the sampler's distribution, the
    clipped surrogate is taken against the learner's, and the cap bounds the
    variance that a token the sampler found unlikely would add.

    Args:
        old_logprobs: [B, T] the learner's log-probs of the tokens, before the update.
        sampler_logprobs: [B, T] the sampler's log-probs of the same tokens.
        loss_mask: [B, T] 1 on sampled tokens; elsewhere the weight is 0.
        cap: the truncation, > 0.

    Returns:
        The weights [B, T] (detached), and scalars over the masked tokens:
        "logprob_diff_max" (largest |old - sampler|), "is_ratio_mean" (mean of the
        untruncated ratio) and "is_truncated_fraction" (share of tokens over the cap).
    """
    if not old_logprobs.shape == sampler_logprobs.shape == loss_mask.shape:
        raise ValueError(
            "old_logprobs, sampler_logprobs and loss_mask must have one shape; got "
            f"{tuple(old_logprobs.shape)}, {tuple(sampler_logprobs.shape)}, "
            f"{tuple(loss_mask.shape)}"
        )
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    keep = loss_mask.bool()
    diff = torch.where(keep, old_logprobs.detach() - sampler_logprobs.detach(), 0.0)
    ratio = torch.exp(diff.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    weights = torch.where(keep, ratio.clamp(max=cap), 0.0)
    stats = {
        "logprob_diff_max": diff.abs().max() if keep.any() else torch.zeros(()),
        "is_ratio_mean": masked_mean(ratio, keep),
        "is_truncated_fraction": masked_mean((ratio > cap).float(), keep),
    }
    return weights, stats


# The built-in losses differ only in how per-token terms are reduced (TRL's `loss_type` names).
register_policy_loss("grpo")(partial(clipped_policy_loss, aggregation="seq_mean_token_mean"))
register_policy_loss("bnpo")(partial(clipped_policy_loss, aggregation="token_mean"))
register_policy_loss("dr_grpo")(partial(clipped_policy_loss, aggregation="seq_mean_token_sum_norm"))
register_policy_loss("dapo", weight="tokens")(
    partial(clipped_policy_loss, aggregation="token_mean")
)
register_policy_loss("token_mean", weight="tokens")(LOSSES["dapo"].fn)  # the older name of dapo


def entropy_from_logprobs(logprobs: Tensor) -> Tensor:
    """Entropy in nats of each position's next-token distribution: [B, T, V] -> [B, T].

    Takes log-softmax output (the learner already has it); -inf entries
    (banned tokens) count as 0 * log 0 = 0.
    """
    # zeroing -inf first keeps its gradient 0 instead of 0 * inf = NaN; exp(-inf) = 0 then
    # zeroes whatever finite value stands there
    finite = torch.where(torch.isfinite(logprobs), logprobs, 0.0)
    return -(logprobs.exp() * finite).sum(dim=-1)
