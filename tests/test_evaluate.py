"""Evaluation statistics against hand-computed values."""

from __future__ import annotations

import math

import pytest

from agentgym.evaluate import best_step, maj_at_k, paired_bootstrap, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
        (5, 0, 3, 0.0),  # none correct
        (5, 5, 3, 1.0),  # all correct
        (4, 1, 1, 0.25),  # c / n
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5) = 1 - 21/252 = 0.916667
        (4, 2, 4, 1.0),  # n = k with one correct in the draw: n - c < k
        (3, 0, 3, 0.0),  # n = k, none correct
    ],
)
def test_pass_at_k_matches_the_binomial_formula(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, 1, 0), (3, 1, 4), (3, -1, 1)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_maj_at_k_votes_ties_and_missing_answers():
    assert maj_at_k(["7", "7", "3"], "7", 3) == 1.0
    assert maj_at_k(["3", "7", "7"], "7", 3) == 1.0
    assert maj_at_k(["3", "7", "7"], "7", 2) == 0.0  # first two: a tie, the first seen wins
    assert maj_at_k([None, None, "7"], "7", 3) == 1.0  # no answer casts no vote
    assert maj_at_k([None, None], "7", 2) == 0.0
    assert maj_at_k(["7"], "7", 1) == 1.0  # n = k = 1
    with pytest.raises(ValueError, match="maj@k needs"):
        maj_at_k(["7"], "7", 2)


def test_paired_bootstrap_centres_on_the_mean_difference():
    a, b = [1, 1, 1, 0, 1, 1, 0, 1], [0, 1, 0, 0, 1, 0, 0, 1]
    mean, low, high = paired_bootstrap(a, b, resamples=4000)
    assert mean == pytest.approx(3 / 8)  # three tasks where only a is right
    assert 0.0 <= low < mean < high <= 0.75
    same = paired_bootstrap(a, a)
    assert same == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="equal, non-empty"):
        paired_bootstrap([1.0], [1.0, 0.0])


def test_best_step_picks_the_best_held_out_score_earliest_on_ties():
    history = [
        {"step": 1, "reward/mean": 0.1},
        {"step": 2, "eval/correctness": 0.20},
        {"step": 3, "reward/mean": 0.9},
        {"step": 4, "eval/correctness": 0.35},
        {"step": 6, "eval/correctness": 0.35},
        {"step": 8, "eval/correctness": 0.30},
    ]
    assert best_step(history) == 4
    assert best_step(history[:1]) is None
    assert best_step(history, key="reward/mean") == 3
