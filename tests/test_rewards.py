"""Boxed-answer extraction, math equivalence, the tutorial's rewards, and composition."""

import logging
import threading

import pytest

from agentgym.rewards.verifiable import (
    answers_equal,
    combine,
    extract_boxed,
    format_reward,
    math_reward,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so the answer is \boxed{42}.", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"first \boxed{1}, then \boxed{2}", "2"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\boxed {7}", "7"),
        (r"\boxed{a \boxed{b} c}", r"a \boxed{b} c"),
        (r"\boxed{}", ""),
    ],
)
def test_extract_boxed_finds_the_last_balanced_box(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "text",
    [r"the answer is 42", r"\boxed{\frac{1}{2}", r"\boxed{1} and \boxed{2", r"\boxed 5", ""],
)
def test_extract_boxed_gives_none_without_a_complete_box(text):
    assert extract_boxed(text) is None


@pytest.mark.parametrize(
    ("predicted", "expected"),
    [
        ("0.5", "1/2"),
        (r"\frac{1}{2}", "0.5"),
        (r"\frac{1}{2}", "1/2"),
        ("3.0", "3"),
        ("-4", "-4"),
        ("- 4", "-4"),
        ("1,000", "1000"),
        ("2^{10}", "1024"),
        ("Paris", "paris"),
        ("New  York.", "new york"),
        ("O'Brien", "o'brien"),
    ],
)
def test_answers_equal_accepts_equivalent_forms(predicted, expected):
    assert answers_equal(predicted, expected)


@pytest.mark.parametrize(
    ("predicted", "expected"),
    [
        ("4", "-4"),
        ("0.51", "1/2"),
        ("5 or 6", "5"),
        ("", "5"),
        ("}{", "5"),
        (r"\frac{1}{", "0.5"),
        ("hello", "5"),
        ("x" * 5000, "5"),
        ("no", "on"),  # math-verify reads words as products of symbols: these were equal
        ("on", "no"),
        ("cba", "abc"),
        ("snuny", "sunny"),
        ("Lima", "Mali"),
        ("yes", "no"),
    ],
)
def test_answers_equal_rejects_wrong_or_garbage_answers(predicted, expected):
    assert not answers_equal(predicted, expected)


@pytest.mark.parametrize("explosive", ["9^{9^{9^{9}}}", "(10^{10})!", "2^{-99999999}"])
def test_answers_equal_refuses_explosive_answers_off_the_main_thread(explosive):
    results = []
    worker = threading.Thread(target=lambda: results.append(answers_equal(explosive, "5")))
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "comparison hung without math-verify's signal timeout"
    assert results == [False]


def test_answers_equal_works_off_the_main_thread():
    results = []
    worker = threading.Thread(target=lambda: results.append(answers_equal("0.25", "1/4")))
    worker.start()
    worker.join(timeout=30)
    assert results == [True]


def test_math_verify_s_timeout_off_warning_is_not_shown(monkeypatch, caplog):
    # off the main thread its alarm is off on purpose (`_bounded` stands in); its once-per-
    # process warning would tell every user to "provide the logic" themselves
    import math_verify.grader
    import math_verify.parser

    monkeypatch.setattr(math_verify.parser, "TIMEOUT_WARNING_SHOWN", False)
    monkeypatch.setattr(math_verify.grader, "TIMEOUT_WARNING_SHOWN", False)
    results = []
    worker = threading.Thread(target=lambda: results.append(answers_equal("0.125", "1/8")))
    with caplog.at_level(logging.WARNING):
        worker.start()
        worker.join(timeout=30)
    assert results == [True] and caplog.records == []


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        (r"2 + 2 = 4, so \boxed{4}", 1.0),
        (r"\boxed{\frac{8}{2}}", 1.0),
        (r"2 + 2 = 5, so \boxed{5}", 0.0),
        ("2 + 2 = 4", -1.0),
        (r"\boxed{4", -1.0),
    ],
)
def test_math_reward_takes_the_tutorials_three_values(completion, reward):
    assert math_reward(completion, "4") == reward


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("Thought: I need the weather.\nAction: get_weather", 0.3),
        ('I will call {"name": "get_weather", "arguments": {"city": "Paris"}}', 0.3),
        ("Action: before\nThought: after", -0.2),
        (r"plain prose with LaTeX \frac{1}{2} and {} braces", -0.2),
        ("", -0.2),
    ],
)
def test_format_reward_defaults_to_the_tutorials_react_or_json(completion, reward):
    assert format_reward(completion) == reward


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("2 + 2 = 4.\nThe answer is \\boxed{4}.", 0.3),
        ("$\\boxed{4}$\n", 0.3),
        ("\\boxed{4}\nActually, let me check again: 2 + 2 = 4.", -0.2),
        ("\\boxed{3} or \\boxed{4}", -0.2),
        ("\\boxed{4", -0.2),
        ("the answer is 4", -0.2),
    ],
)
def test_format_reward_for_a_boxed_final_answer(completion, reward):
    assert format_reward(completion, formats=("boxed",)) == reward


def test_format_reward_rejects_unknown_formats():
    with pytest.raises(ValueError, match="valid: a non-empty subset"):
        format_reward("x", formats=("xml",))


def test_combine_weights_the_parts():
    parts = {"correctness": 1.0, "format": -0.2, "length": 123.0}
    assert combine(parts, {"correctness": 1.0, "format": 0.1}) == pytest.approx(0.98)


def test_combine_names_a_weight_without_a_part():
    with pytest.raises(ValueError, match="'efficiency'"):
        combine({"correctness": 1.0}, {"correctness": 1.0, "efficiency": 0.5})
