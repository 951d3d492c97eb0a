"""The paired bootstrap's exact contract: seeded, every task drawn, percentile ends.

Written against the mutants `make mutate` found alive in `agentgym.eval.stats`.
"""

from __future__ import annotations

from agentgym.eval.stats import paired_bootstrap

A = [(0.618034 * i) % 1 for i in range(1, 31)]  # 30 distinct scores: few bootstrap means tie
B = [0.0] * len(A)


def test_a_seed_fixes_the_interval_and_the_defaults_are_seed_0_and_10000_resamples():
    first = paired_bootstrap(A, B, seed=5)
    assert paired_bootstrap(A, B, seed=5) == first
    assert paired_bootstrap(A, B, seed=6) != first
    assert paired_bootstrap(A, B) == paired_bootstrap(A, B, resamples=10_000, seed=0)
    assert paired_bootstrap(A, B) != paired_bootstrap(A, B, resamples=10_001, seed=0)


def test_every_task_can_be_drawn():
    # only the first task differs: a resample without it has mean 0, one with it more
    mean, low, high = paired_bootstrap([1.0, 0.0, 0.0], [0.0, 0.0, 0.0], resamples=200)
    assert mean == 1 / 3
    assert low == 0.0 and high > 0.0


def test_a_zero_level_interval_is_the_median_of_the_bootstrap_means():
    # the bounds are the (1 - level) / 2 and 1 - (1 - level) / 2 quantiles: at level 0
    # both are the median, so they coincide
    _, low, high = paired_bootstrap(A, B, resamples=1001, level=0.0)
    assert low == high
    _, low, high = paired_bootstrap(A, B, resamples=1001, level=0.5)
    assert low < high
