"""Evaluation statistics: pass@k, maj@k, paired bootstrap intervals, best checkpoint.

Pure functions over per-task results, so `agentgym eval` and the training
loop's held-out evaluation share them and tests can check them by hand.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, eq. 1).

    pass@k = 1 - C(n - c, k) / C(n, k): the chance that k samples drawn
    without replacement from the n include a correct one. Computed as a
    product, 1 - prod_{i = n-c+1}^{n} (1 - k / i), which never overflows.

    Raises:
        ValueError: unless 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    # a shortcut: with n - c < k the product has the factor 1 - k / k = 0 and gives 1.0 too
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def maj_at_k(answers: Sequence[Hashable | None], correct: Hashable, k: int) -> float:
    """1.0 when the most common of the first k answers is `correct`, else 0.0.

    Missing answers (None) do not vote; a tie goes to the answer seen first;
    k answers with no vote at all score 0.0.

    Raises:
        ValueError: unless 1 <= k <= len(answers).
    """
    if not 1 <= k <= len(answers):
        raise ValueError(f"maj@k needs 1 <= k <= {len(answers)} answers; got k={k}")
    votes = Counter(a for a in answers[:k] if a is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    winner = next(a for a in answers[:k] if a is not None and votes[a] == top)
    return 1.0 if winner == correct else 0.0


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    *,
    resamples: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Mean of the per-task differences a - b and its percentile bootstrap interval.

    `a[i]` and `b[i]` are two models' scores on the same task i; tasks are
    resampled with replacement, keeping each pair together.

    Returns:
        (mean difference, lower bound, upper bound).
    """
    if len(a) != len(b) or not a:
        raise ValueError(
            f"paired_bootstrap needs two equal, non-empty lists; got {len(a)}, {len(b)}"
        )
    # float, as numpy refuses bool - bool
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(resamples, len(diff)))].mean(axis=1)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(diff.mean()), float(low), float(high)


def best_step(history: Sequence[Mapping[str, Any]], key: str = "eval/correctness") -> int | None:
    """The step whose held-out `key` is highest (the earliest among ties); None when none has it.

    `history` holds metric records with a "step" field, as in metrics.jsonl;
    records without `key` (steps with no evaluation) are skipped.
    """
    scored = [(r[key], -r["step"]) for r in history if key in r and r[key] is not None]
    if not scored:
        return None
    return -max(scored)[1]
