"""Training health: the warning signs of the seed tutorial's section 7, as checks.

Each check reads the run's metric history (the records of metrics.jsonl,
oldest first) and says whether its sign is present now. Signs:

- "kl_high" / "kl_low": KL outside [0.01, 0.1] for `patience` steps in a
  row (too high: the policy drifts from the reference, raise beta; too low,
  checked after `warmup` steps: the policy is not moving);
- "entropy_collapse": entropy below `collapse` x its starting level
  (mode collapse: lower the learning rate or raise the temperature);
- "length_explosion": mean completion length above `explosion` x its
  starting level (the model may be padding for reward: add a length penalty);
- "reward_falling": held-out correctness fell at `patience` evaluations in a row;
- "zero_variance": more than half of the groups had equal rewards for
  `patience` steps in a row (nothing to learn from: easier tasks or SFT first).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agentgym import records

Record = Mapping[str, float]


@dataclass(frozen=True)
class HealthWarning:
    """One warning sign, at the step it was seen."""

    kind: str
    step: int
    message: str


@dataclass(frozen=True)
class HealthLimits:
    """Thresholds of the checks; the defaults are the tutorial's."""

    kl_low: float = 0.01
    kl_high: float = 0.1
    patience: int = 3
    warmup: int = 10
    collapse: float = 0.3
    explosion: float = 2.0
    baseline_steps: int = 3


def _values(history: Sequence[Record], key: str) -> list[float]:
    return [float(r[key]) for r in history if r.get(key) is not None]


def _last_n_all(values: Sequence[float], n: int, test) -> bool:
    return len(values) >= n and all(test(v) for v in values[-n:])


def check_health(
    history: Sequence[Record], limits: HealthLimits = HealthLimits(), *, beta: float = 0.04
) -> list[HealthWarning]:
    """The warning signs present at the last record of `history` (none for an empty one)."""
    if not history:
        return []
    step, lim, out = int(history[-1]["step"]), limits, []

    def warn(kind: str, message: str) -> None:
        out.append(HealthWarning(kind, step, message))

    kl = _values(history, records.KL)
    if beta > 0 and _last_n_all(kl, lim.patience, lambda v: v > lim.kl_high):
        warn("kl_high", f"KL above {lim.kl_high} for {lim.patience} steps: raise grpo.beta")
    if (
        beta > 0
        and len(history) > lim.warmup
        and _last_n_all(kl, lim.patience, lambda v: v < lim.kl_low)
    ):
        warn("kl_low", f"KL below {lim.kl_low} for {lim.patience} steps: the policy is not moving")
    for key, kind, factor, above in (
        (records.ENTROPY, "entropy_collapse", lim.collapse, False),
        (records.COMPLETION_LENGTH, "length_explosion", lim.explosion, True),
    ):
        values = _values(history, key)
        if len(values) <= lim.baseline_steps:
            continue
        start = sum(values[: lim.baseline_steps]) / lim.baseline_steps
        now = values[-1]
        if (above and now > factor * start) or (not above and now < factor * start):
            warn(kind, f"{key} went from {start:.3g} to {now:.3g}")
    evals = _values(history, records.EVAL_CORRECTNESS)
    falls = [b < a for a, b in zip(evals, evals[1:], strict=False)]
    if _last_n_all(falls, lim.patience, bool):
        warn("reward_falling", f"held-out correctness fell {lim.patience} evaluations in a row")
    zero = _values(history, records.ZERO_VARIANCE)
    if _last_n_all(zero, lim.patience, lambda v: v > 0.5):
        warn("zero_variance", f"over half the groups had equal rewards for {lim.patience} steps")
    return out
