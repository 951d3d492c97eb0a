"""Each health warning fires on a series that should trigger it, and not on one that should not."""

from __future__ import annotations

import pytest

from agentgym.run.health import HealthLimits, check_health


def _series(key: str, values: list[float]) -> list[dict]:
    return [{"step": i + 1, key: v} for i, v in enumerate(values)]


def _kinds(history, **kwargs) -> set[str]:
    return {w.kind for w in check_health(history, HealthLimits(warmup=4), **kwargs)}


@pytest.mark.parametrize(
    ("key", "bad", "good", "kind"),
    [
        ("kl", [0.02, 0.2, 0.3, 0.25], [0.02, 0.2, 0.05, 0.25], "kl_high"),
        ("kl", [0.0] * 8, [0.0] * 6 + [0.02, 0.0], "kl_low"),
        ("entropy", [2.0, 2.0, 2.0, 1.5, 0.5], [2.0, 2.0, 2.0, 1.5, 0.7], "entropy_collapse"),
        (
            "avg_completion_length",
            [100, 100, 100, 150, 201],
            [100, 100, 100, 150, 199],
            "length_explosion",
        ),
        ("eval/correctness", [0.5, 0.4, 0.3, 0.2], [0.5, 0.4, 0.45, 0.2], "reward_falling"),
        ("zero_variance_groups", [0.2, 0.6, 0.75, 1.0], [0.6, 0.75, 0.5, 1.0], "zero_variance"),
    ],
)
def test_a_warning_fires_on_its_sign_and_not_without_it(key, bad, good, kind):
    assert kind in _kinds(_series(key, bad))
    assert kind not in _kinds(_series(key, good))


def test_kl_checks_are_off_without_a_kl_term_and_low_kl_waits_for_warmup():
    assert "kl_high" not in _kinds(_series("kl", [0.5] * 5), beta=0.0)
    assert "kl_low" not in _kinds(_series("kl", [0.0] * 4))  # still warming up
    (warning,) = check_health(_series("kl", [0.2] * 3))
    assert warning.step == 3 and "grpo.beta" in warning.message


def test_an_empty_or_healthy_history_has_no_warnings():
    assert check_health([]) == []
    healthy = [
        {"step": s, "kl": 0.03, "entropy": 2.0, "avg_completion_length": 120.0,
         "zero_variance_groups": 0.25}
        for s in range(1, 20)
    ]  # fmt: skip
    assert check_health(healthy) == []
