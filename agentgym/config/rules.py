"""Which options go together: every rule across sections, written once, in one table.

A `Rule` names the option it refuses, when, and why. `Config` checks the rules that hold
anywhere as it is built (the first broken one is the error, its message alone);
`agentgym.run.preflight.check_torchrun` checks those that hold only under torchrun (more
than one rank), before any model loads. Nothing else decides whether two options can run
together: a new combination is a row here, with its test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class Config(Protocol):
    """The sections of `agentgym.config.Config` the rules read (that module builds its
    validator from this one, so it cannot be imported here)."""

    run: Any
    grpo: Any
    pipeline: Any
    policy: Any
    distributed: Any


@dataclass(frozen=True)
class Rule:
    """A combination of options that cannot run: `broken(config)` says the config has it.

    Attributes:
        option: The option the message begins with (the one to change).
        broken: Whether `config` has the combination.
        why: The message, naming the options and what would be valid.
        torchrun: Whether it holds only under torchrun with more than one rank.
    """

    option: str
    broken: Callable[[Config], bool]
    why: str
    torchrun: bool = False


def _async(c: Config) -> bool:
    return c.pipeline.max_off_policy_steps > 0


def _partial(c: Config) -> bool:
    return c.pipeline.partial_rollouts


def _turns_shared(c: Config) -> bool:
    return c.run.turn_batching != "barrier"


RULES: tuple[Rule, ...] = (
    Rule(
        "pipeline.partial_rollouts",
        lambda c: _partial(c) and not _async(c),
        "pipeline.partial_rollouts needs pipeline.max_off_policy_steps >= 1 (with 0 nothing "
        "is played while the learner steps)",
    ),
    Rule(
        "pipeline.partial_rollouts",
        lambda c: _partial(c) and c.distributed.backend != "none",
        "pipeline.partial_rollouts plays turn by turn in this process: "
        "distributed.backend must be 'none'",
    ),
    Rule(
        "run.turn_batching",
        lambda c: _turns_shared(c) and _partial(c),
        "run.turn_batching {turn_batching!r} with pipeline.partial_rollouts: weights loaded "
        "between turns would leave the running batch's keys and values stale; use 'barrier'",
    ),
    Rule(
        "run.turn_batching",
        lambda c: _turns_shared(c) and (c.run.agent is not None or c.run.player is not None),
        "run.turn_batching {turn_batching!r} with run.agent or run.player: the turn loop's "
        "batching; an agent program or a player of its own plays its own turns",
    ),
    Rule(
        "run.player",
        lambda c: c.run.player is not None and c.run.agent is not None,
        "run.player with run.agent: each names who plays the episodes; give one",
    ),
    Rule(
        "pipeline.partial_rollouts",
        lambda c: _partial(c) and c.run.agent is not None,
        "pipeline.partial_rollouts with run.agent: an agent program's turns go through "
        "the endpoint, which takes new weights between episodes, not between turns",
    ),
    Rule(
        "pipeline.partial_rollouts",
        lambda c: _partial(c) and c.run.player is not None,
        "pipeline.partial_rollouts with run.player: new weights between turns are loaded "
        "by the turn loop's sampler only",
    ),
    Rule(
        "pipeline.partial_rollouts",
        lambda c: _partial(c) and c.policy.backend == "vllm",
        "pipeline.partial_rollouts with policy.backend 'vllm': weights loaded between "
        "turns are played by the transformers sampler only; use policy.backend 'hf'",
    ),
    Rule(
        "policy.enable_sleep_mode",
        lambda c: _async(c) and c.policy.enable_sleep_mode and c.distributed.backend == "none",
        "policy.enable_sleep_mode with pipeline.max_off_policy_steps > 0: the engine "
        "samples while the learner steps, so its memory cannot be freed then; "
        "set policy.enable_sleep_mode=false, or play on Ray workers",
    ),
    Rule(
        "grpo.dynamic_sampling",
        lambda c: c.grpo.dynamic_sampling and _async(c),
        "grpo.dynamic_sampling with pipeline.max_off_policy_steps > 0: it samples more "
        "tasks within the step, while the next steps' tasks are already being played; "
        "set pipeline.max_off_policy_steps=0, or grpo.dynamic_sampling=false",
    ),
    Rule(
        "grpo.dynamic_sampling",
        lambda c: c.grpo.dynamic_sampling,
        "grpo.dynamic_sampling under torchrun: the ranks' steps would wait on rank 0's "
        "extra rounds, which is not built; run it in one process",
        torchrun=True,
    ),
    Rule(
        "pipeline.max_off_policy_steps",
        _async,
        "pipeline.max_off_policy_steps > 0 under torchrun: the learner's ranks step in "
        "lockstep with rank 0's sampling; run it in one process",
        torchrun=True,
    ),
    Rule(
        "policy.backend",
        lambda c: c.distributed.learner == "fsdp" and c.policy.backend != "hf",
        "distributed.learner 'fsdp' under torchrun samples on rank 0 with transformers: "
        "policy.backend must be 'hf' (got {policy_backend!r}); or use "
        "distributed.learner 'ddp' with policy.backend 'vllm'",
        torchrun=True,
    ),
    Rule(
        "distributed.backend",
        lambda c: c.distributed.learner == "fsdp" and c.distributed.backend != "none",
        "distributed.learner 'fsdp' under torchrun samples on rank 0: distributed.backend "
        "must be 'none' (got {distributed_backend!r}); or use distributed.learner "
        "'ddp' with Ray rollout workers",
        torchrun=True,
    ),
)


def broken_rules(config: Config, *, torchrun: bool = False) -> list[str]:
    """The messages of the rules `config` breaks: those that hold anywhere, or, with
    `torchrun`, those that hold under torchrun; in the table's order."""
    values = {
        "turn_batching": config.run.turn_batching,
        "policy_backend": config.policy.backend,
        "distributed_backend": config.distributed.backend,
    }
    return [
        rule.why.format(**values)
        for rule in RULES
        if rule.torchrun == torchrun and rule.broken(config)
    ]
