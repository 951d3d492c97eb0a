"""The policy-loss registry: one entry per loss, its function and its micro-batch weight.

`grpo.loss` names an entry of `LOSSES`; `agentgym.learn.grpo` registers the
built-in ones (TRL's `loss_type` names) and users add theirs with
`register_policy_loss`. `LossOutput` is what every loss returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor


@dataclass(frozen=True)
class LossOutput:
    """What a policy loss returns. `loss == policy_loss + beta * kl` (same aggregation)."""

    loss: Tensor  # scalar, differentiable: backpropagate this
    policy_loss: Tensor  # scalar, detached: the aggregated clipped surrogate
    kl: Tensor  # scalar, detached: aggregated k3 KL (0 without ref_logprobs)
    clip_fraction: Tensor  # scalar, detached: share of masked tokens whose gradient is clipped


PolicyLossFn = Callable[..., LossOutput]


@dataclass(frozen=True)
class RegisteredLoss:
    """A policy loss as the learner needs it: the function, and how the learner weighs
    its micro-batches (by their share of the batch's sequences, or of its loss tokens:
    a token mean over the whole batch)."""

    fn: PolicyLossFn
    weight: Literal["sequences", "tokens"]


LOSSES: dict[str, RegisteredLoss] = {}
"""Every registered policy loss, by name (`grpo.loss`)."""


class _LossField(MutableMapping[str, Any]):
    """One field of `LOSSES` by loss name: read it, or remove a loss (`pop`, `del`)."""

    def __init__(self, field: str) -> None:
        self._field = field

    def __getitem__(self, name: str) -> Any:
        return getattr(LOSSES[name], self._field)

    def __setitem__(self, name: str, value: Any) -> None:
        raise TypeError("add a policy loss with register_policy_loss(name, weight)")

    def __delitem__(self, name: str) -> None:
        del LOSSES[name]

    def __iter__(self) -> Iterator[str]:
        return iter(LOSSES)

    def __len__(self) -> int:
        return len(LOSSES)


POLICY_LOSSES: MutableMapping[str, PolicyLossFn] = _LossField("fn")
MICRO_BATCH_WEIGHTS: MutableMapping[str, Literal["sequences", "tokens"]] = _LossField("weight")
"""The functions and the micro-batch weights of `LOSSES`, by name (views of it)."""


def register_policy_loss(
    name: str, weight: Literal["sequences", "tokens"] = "sequences"
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator adding a loss to LOSSES under `name`; a taken name is a ValueError.

    A registered loss is called as `fn(logprobs [B, T], old_logprobs [B, T],
    advantages [B, T], loss_mask [B, T], *, ref_logprobs=None, epsilon=0.2, beta=0.0,
    epsilon_high=None, importance_sampling_level="token", kl_estimator="k3",
    max_tokens=None) -> LossOutput` on one micro-batch; the learner sums the
    micro-batches' losses, each times its share of the batch (`weight`). With a
    vLLM sampler it also passes `is_weights=` [B, T] (see `clipped_policy_loss`).
    """

    def add(fn: PolicyLossFn) -> PolicyLossFn:
        if name in LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        LOSSES[name] = RegisteredLoss(fn, weight)
        return fn

    return add


def get_policy_loss(name: str) -> PolicyLossFn:
    """The registered loss called `name`; ValueError listing the known names otherwise."""
    if name not in LOSSES:
        known = ", ".join(sorted(LOSSES))
        raise ValueError(f"unknown policy loss {name!r}; registered: {known}")
    return LOSSES[name].fn
