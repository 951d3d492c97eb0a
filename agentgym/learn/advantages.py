"""The `advantages` stage: advantage estimators, registered by name (`grpo.advantage`).

An estimator is a function `fn(record, grpo) -> Tensor`: from a scored step record
(`agentgym.types.StepRecord`: its trajectories, `rewards` [N] with NaN where an episode
is unscorable, `scorable` [N]) and the config's `grpo` section, the advantage of every
target token, [N, T], aligned as `agentgym.types.sampled_targets` aligns them (position t
is token t + 1 of the trajectory; T is the longest trajectory's length - 1). Only the
positions of sampled tokens are read; the learner carries the rows through dropped groups,
micro-batches and packing. Where episodes were split into samples (a rewritten history,
`Trajectory.split_samples`), an estimator may give those their own values too: [N + M, T],
the rows of `all_rows` (else each takes its episode's mean; `with_split_samples`). Users
add theirs with `register_advantage`, as losses are added with
`agentgym.learn.losses.register_policy_loss`:

    @register_advantage("last_turn_double")
    def last_turn_double(record, grpo):
        ...

`group` is GRPO's (`agentgym.learn.grpo.group_advantages`): one group-relative value per
trajectory, on each of its sampled tokens. `turn` gives each turn its own
(`agentgym.learn.turn_credit`); `grpo.credit: turn` picks it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch import Tensor

from agentgym.config import GRPOConfig
from agentgym.learn import grpo, turn_credit
from agentgym.types import StepRecord, Trajectory, sampled_targets, target_width

AdvantageFn = Callable[[StepRecord, GRPOConfig], Tensor]

ADVANTAGES: dict[str, AdvantageFn] = {}
"""Every registered advantage estimator, by name (`grpo.advantage`)."""


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator adding an estimator to ADVANTAGES under `name`; a taken name is a ValueError."""

    def add(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGES:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGES[name] = fn
        return fn

    return add


def get_advantage(name: str) -> AdvantageFn:
    """The estimator called `name`; ValueError listing the registered names otherwise."""
    if name not in ADVANTAGES:
        known = ", ".join(sorted(ADVANTAGES))
        raise ValueError(f"unknown advantage estimator {name!r}; registered: {known}")
    return ADVANTAGES[name]


def unregistered(g: GRPOConfig) -> dict[str, str]:
    """The `grpo` fields that name no registered loss or estimator, each with the message
    that says so: checked as a run starts, after the user's modules registered theirs."""
    problems = {}
    if g.loss not in grpo.LOSSES:
        problems["grpo.loss"] = (
            f"unknown loss {g.loss!r}; registered: {', '.join(sorted(grpo.LOSSES))}"
        )
    if g.advantage not in ADVANTAGES:
        problems["grpo.advantage"] = (
            f"unknown advantage estimator {g.advantage!r}; registered: "
            f"{', '.join(sorted(ADVANTAGES))}"
        )
    if g.credit == "turn" and g.advantage != "group":
        problems["grpo.credit"] = (
            f"credit 'turn' is the turn estimator, and grpo.advantage names {g.advantage!r}: "
            "set credit 'episode' to use it, or leave grpo.advantage 'group'"
        )
    return problems


@register_advantage("group")
def group(record: StepRecord, g: GRPOConfig) -> Tensor:
    """GRPO's group-relative advantage of each trajectory (`grpo.scale_rewards` divides
    it), on every token it sampled."""
    assert record.rewards is not None  # `advantages` checked that it was scored
    per_row = grpo.group_advantages(
        record.rewards,
        g.group_size,
        g.std_eps,
        scale=g.scale_rewards,
        scorable=record.scorable,
        unbiased=g.std == "unbiased",
    )
    return per_row[:, None] * sampled_targets(record.trajectories)


@register_advantage("turn")
def turn(record: StepRecord, g: GRPOConfig) -> Tensor:
    """Each turn's return from it on, less a baseline from the group's other members (the
    same state's, else the same turn's), divided as `grpo.scale_rewards` says; on the ids
    the turn sampled. See `agentgym.learn.turn_credit`."""
    assert record.rewards is not None and record.scorable is not None
    return turn_credit.turn_targets(
        record.trajectories, record.rewards, record.scorable, g.group_size, _scales(record, g)
    )


def _scales(record: StepRecord, g: GRPOConfig) -> list[float]:
    """Per group, what divides its advantages: GRPO's std (+ `std_eps`) of the episode
    rewards, the group's or the batch's, or 1; 0 for a group whose std is 0 (it gets 0)."""
    assert record.rewards is not None
    groups, valid = grpo.grouped(record.rewards, g.group_size, record.scorable)
    if g.scale_rewards == "none":
        return [1.0] * len(groups)
    correction = 1 if g.std == "unbiased" else 0
    if g.scale_rewards == "batch":
        scored = groups[valid].double()
        std = float(scored.std(correction=correction)) if scored.numel() > 1 else 0.0
        return [std + g.std_eps if std > 0 else 0.0] * len(groups)
    out = []
    for row, ok in zip(groups.double(), valid, strict=True):
        scored = row[ok]
        std = float(scored.std(correction=correction)) if scored.numel() > 1 else 0.0
        out.append(std + g.std_eps if std > 0 else 0.0)
    return out


def advantage_name(g: GRPOConfig) -> str:
    """The estimator a run uses: `turn` with `grpo.credit: turn`, else `grpo.advantage`."""
    return "turn" if g.credit == "turn" else g.advantage


def advantages(record: StepRecord, g: GRPOConfig) -> StepRecord:
    """`record` with its per-token `advantages` from the estimator `grpo.advantage`, and
    its `flat_groups`. The groups are checked first: G contiguous samples of one task each.

    Raises:
        TrainingError: when the samples do not come in groups (`grpo.check_groups`).
        ValueError: when the record was not scored, or the estimator's tensor is not [N, T].
    """
    record.require("rewards", "scorable")
    assert record.rewards is not None
    trajectories = record.trajectories
    grpo.check_groups(
        [t.task_id for t in trajectories], [t.group for t in trajectories], g.group_size
    )
    name = advantage_name(g)
    values = get_advantage(name)(record, g)
    want = (len(trajectories), target_width(trajectories))
    splits = [s for t in trajectories for s in t.split_samples]
    own = None
    if splits and tuple(values.shape) == (want[0] + len(splits), target_width(all_rows(record))):
        own = values[want[0] :, : target_width(splits)]
        values = values[: want[0], : want[1]]
    if tuple(values.shape) != want:
        raise ValueError(
            f"advantage estimator {name!r} returned a tensor of shape "
            f"{tuple(values.shape)}; it must be [N, T] = {want}: one value per target token "
            "of each trajectory (see agentgym.types.sampled_targets)"
        )
    flat = grpo.flat_groups(record.rewards, g.group_size, scorable=record.scorable)
    return replace(record, advantages=values, split_advantages=own, flat_groups=flat)


def all_rows(record: StepRecord) -> list[Trajectory]:
    """The trajectories, then each one's split samples in order: the rows an estimator may
    give values for, [N + M, T] (`StepRecord.split_advantages` keeps the last M)."""
    return [*record.trajectories, *(s for t in record.trajectories for s in t.split_samples)]


def split_weights(count: int) -> list[float]:
    """The loss weight of each of an episode's `count` samples (an agent program that
    rewrote its history gave several, `Trajectory.split_samples`): 1 / count each, so that
    the episode counts once, as an episode of one sample does. The one place that decides."""
    return [1.0 / count] * count


def with_split_samples(
    trajectories: Sequence[Trajectory], advantages: Tensor, own: Tensor | None = None
) -> tuple[list[Trajectory], Tensor]:
    """The rows to learn from: the trajectories, then each one's split samples as rows of
    their own, with the advantages [N + M, T'] of them all (`split_weights`).

    A split sample gets its own advantages where the estimator gave them (`own`, [M, T'']:
    the turn estimator's), else its episode's (the mean of its row's advantages over the
    tokens the row sampled) on every token it sampled; every sample of such an episode,
    the row itself too, is weighted by `split_weights`. Without split samples, the
    trajectories and advantages as given.
    """
    if not any(t.split_samples for t in trajectories):
        return list(trajectories), advantages
    rows, values = list(trajectories), []
    weights: list[float] = []
    advantages = advantages.clone()
    sampled = torch.zeros(advantages.shape, dtype=torch.bool)
    targets = sampled_targets(trajectories)[:, : advantages.shape[1]] > 0
    sampled[:, : targets.shape[1]] = targets
    for i, t in enumerate(trajectories):
        if not t.split_samples:
            continue
        *earlier, last = split_weights(1 + len(t.split_samples))
        mine = advantages[i][sampled[i]]
        value = float(mine.mean()) if mine.numel() else 0.0
        advantages[i] *= last
        rows += t.split_samples
        values += [value] * len(earlier)
        weights += earlier
    extra = sampled_targets(rows[len(trajectories) :])
    if own is None:
        extra = extra * torch.tensor([v * w for v, w in zip(values, weights, strict=True)])[:, None]
    else:
        extra = extra * own[:, : extra.shape[1]].to(extra.dtype) * torch.tensor(weights)[:, None]
    width = max(advantages.shape[1], extra.shape[1])
    out = torch.zeros((len(rows), width), dtype=advantages.dtype)
    out[: len(trajectories), : advantages.shape[1]] = advantages
    out[len(trajectories) :, : extra.shape[1]] = extra
    return rows, out
