"""The `purchase` family of ToolCall-v0: a seeded purchasing world behind lookup tools.

Every level's reference solution scores the maximum and has the level's call shape;
answers match ones computed here by hand from the world's facts; the splits are
disjoint and large enough; bad names are tool errors; the default families are
unchanged.
"""

from __future__ import annotations

import math
import re
import warnings
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

import gymnasium as gym
import pytest
from episodes import play
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import agentgym  # noqa: F401  (registers agentgym/ToolCall-v0)
from agentgym.env.checker import check_agent_env
from agentgym.envs.tool_call.calculator import calculate
from agentgym.envs.tool_call.env import ToolCallEnv
from agentgym.envs.tool_call.problem import DISCOUNTS, TAX_RATES
from agentgym.envs.tool_call.purchase import (
    DISTRACTORS,
    LOOKUPS,
    normalised,
    purchase_tools,
    purchase_world,
)
from agentgym.envs.tool_call.tasks import ALL_FAMILIES, FAMILIES, family_size
from agentgym.tools import HERMES
from agentgym.types import ToolCall

LEVELS = [1, 2, 3, 4, 5]
SPLITS = ["train", "test"]
SHAPES = {
    1: ["price", "calculator"],
    2: ["supplier", "discount", "calculator"],
    3: ["supplier", "discount", "price", "calculator"],
    4: ["supplier", "city", "tax", "calculator"],
    5: ["supplier", "city", "tax", "calculator"],
}
# (call, the earlier call whose result it takes as its argument), per level
FEEDS = {1: [], 2: [(1, 0)], 3: [(1, 0)], 4: [(1, 0), (2, 1)], 5: [(1, 0), (2, 1)]}
# (the call that gives a percent, its sign) per level: a discount is taken off, a tax added
PERCENT = {2: (1, -1), 3: (1, -1), 4: (2, 1), 5: (2, 1)}
BEST_PARTS = {"correctness": 1.0, "tool": 1.0, "format": 0.3}


def _env(level=1, **kwargs):
    return ToolCallEnv(families=["purchase"], difficulty=level, tool_format="hermes", **kwargs)


def _tasks(env, split):
    size = family_size("purchase", env.seed, split, env.difficulty)
    return [env.load_task(f"purchase/{split}/{i}") for i in range(size)]


def _play(env, turns):
    """`play`, asserting that no call in any turn was a tool error."""
    steps = [env.step(turn) for turn in turns]
    for turn, (obs, *_, info) in zip(turns, steps, strict=True):
        assert not info["tool_errors"], (turn, obs)
    parts = {k: sum(step[4]["reward_parts"][k] for step in steps) for k in BEST_PARTS}
    return sum(step[1] for step in steps), parts, steps[-1]


def _cents(exact: Fraction) -> str:
    """Dollars rounded half up to cents, the way one does it on paper."""
    cents = math.floor(exact * 100 + Fraction(1, 2))
    return f"{cents // 100}.{cents % 100:02d}"


def _named(world, prompt):
    """The world's items a prompt names, in the order it first names them."""
    first = {
        it: m.start()
        for it in world.items.values()
        if (m := re.search(rf"\b{it.name}s?\b", prompt, re.IGNORECASE))
    }
    return sorted(first, key=first.__getitem__)


# -- every level solvable, with its shape -------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_the_demonstration_scores_the_maximum_at_every_level(level):
    env = gym.make(
        "agentgym/ToolCall-v0", families=["purchase"], difficulty=level, tool_format="hermes"
    )
    weights = env.unwrapped.reward_weights
    best = sum(weights[part] * value for part, value in BEST_PARTS.items())
    for split in SPLITS:
        for index in range(50):
            task_id = f"purchase/{split}/{index}"
            env.reset(options={"task_id": task_id})
            calls, _ = env.unwrapped.reference_solution(task_id)
            assert [c.name for c in calls] == SHAPES[level], task_id
            total, parts, (*_, terminated, truncated, info) = _play(
                env, env.unwrapped.demonstration(env.unwrapped.task)
            )
            assert terminated and not truncated and info["correct"], (task_id, info)
            assert parts == pytest.approx(BEST_PARTS) and total == pytest.approx(best)


@pytest.mark.parametrize("level", LEVELS)
def test_each_reference_call_feeds_the_next_and_no_distractor_is_needed(level):
    env = _env(level)
    run = {t.name: t for t in purchase_tools(env.seed)}
    for split in SPLITS:
        for task in _tasks(env, split):
            calls = task.metadata["reference_calls"]
            assert [c.name for c in calls] == SHAPES[level], task.prompt
            assert not DISTRACTORS & {c.name for c in calls}
            outs = [run[c.name](**c.arguments) for c in calls[:-1]]
            for later, earlier in FEEDS[level]:
                assert next(iter(calls[later].arguments.values())) == outs[earlier], task.prompt
            expression = calls[-1].arguments["expression"]
            assert all(
                f"{it.cents // 100}.{it.cents % 100:02d}" in expression
                for it in _named(purchase_world(env.seed), task.prompt)
            )
            if level in PERCENT:  # the calculation's last factor is 1 -/+ the looked-up percent
                given, sign = PERCENT[level]
                factor = Fraction(expression.rsplit(" * ", 1)[1])
                assert factor == 1 + sign * Fraction(outs[given]) / 100, task.prompt
            result = Decimal(calculate(expression)).quantize(Decimal("0.01"), ROUND_HALF_UP)
            assert str(result) == task.answer, task.prompt


def test_a_wrong_final_answer_scores_below_any_correct_one():
    for level in LEVELS:
        env = _env(level)
        env.reset(options={"task_id": "purchase/train/1"})
        calls, answer = env.reference_solution("purchase/train/1")
        turns = [*(HERMES.render_call(c) for c in calls), f"\\boxed{{{answer}1}}"]
        total, parts, (*_, info) = play(env, turns)
        assert not info["correct"] and info["final_answer"] == f"{answer}1"
        assert parts == pytest.approx({"correctness": 0.0, "tool": 1.0, "format": 0.3})
        # the tool-only ceiling (0.5 + 0.03), below a correct answer's floor (0.98)
        assert total == pytest.approx(0.53) and total < 0.98


def test_at_level_5_the_other_items_supplier_gives_a_wrong_answer():
    env, world = _env(5), purchase_world(0)
    for task in _tasks(env, "test")[:40]:
        a, b = _named(world, task.prompt)
        taxes = [world.cities[normalised(world.supplier_of(it.name).city)].tax for it in (a, b)]
        assert taxes[0] != taxes[1], task.prompt
        na, nb = map(int, re.search(r"What do (\d+) \w+ and (\d+)", task.prompt).groups())
        wrong = Fraction(na * a.cents + nb * b.cents, 100) * (1 + Fraction(taxes[0]) / 100)
        assert _cents(wrong) != task.answer, task.prompt


# -- answers by hand from the world's facts -------------------------------------------


def test_a_level_3_answer_by_hand():
    world, task = purchase_world(0), _env(3).load_task("purchase/train/0")
    (item,) = _named(world, task.prompt)
    n = int(re.search(r"What do (\d+) ", task.prompt).group(1))
    supplier = world.suppliers[normalised(item.supplier)]
    # n units at the unit price, less the supplier's discount, in hundredths of a cent
    hundredths = n * item.cents * (100 - int(supplier.discount))
    cents = (hundredths + 50) // 100
    assert task.answer == f"{cents // 100}.{cents % 100:02d}"
    assert f"{n} {item.name}s" in task.prompt and "$" not in task.prompt


def test_a_level_5_answer_by_hand():
    world, task = purchase_world(0), _env(5).load_task("purchase/test/3")
    a, b = _named(world, task.prompt)
    assert f"${a.cents // 100}.{a.cents % 100:02d}" in task.prompt
    na, nb = map(int, re.search(r"What do (\d+) \w+ and (\d+)", task.prompt).groups())
    city = world.cities[normalised(world.suppliers[normalised(b.supplier)].city)]
    before_tax = Fraction(na * a.cents + nb * b.cents, 100)
    assert task.answer == _cents(before_tax * (1 + Fraction(city.tax) / 100))


# -- the world and the splits ---------------------------------------------------------


def test_the_world_has_its_sizes_and_every_supplier_items_in_both_splits():
    world = purchase_world(0)
    assert (len(world.items), len(world.suppliers), len(world.cities)) == (32, 8, 6)
    assert all(
        150 <= it.cents <= 9999 and it.cents % 2 and it.cents % 5 for it in world.items.values()
    )
    assert sorted(s.discount for s in world.suppliers.values()) == sorted(DISCOUNTS * 2)
    taxes = [c.tax for c in world.cities.values()]
    assert len(set(taxes)) == 6 and set(taxes) <= set(TAX_RATES)
    assert {normalised(s.city) for s in world.suppliers.values()} == set(world.cities)
    for split in SPLITS:
        owners = [normalised(it.supplier) for it in world.split_items(split)]
        assert sorted(owners) == sorted(list(world.suppliers) * 2)


@pytest.mark.parametrize("level", LEVELS)
def test_splits_are_disjoint_large_and_name_only_their_own_items(level):
    env, world = _env(level), purchase_world(0)
    prompts = {}
    for split in SPLITS:
        tasks = _tasks(env, split)
        prompts[split] = {t.prompt for t in tasks}
        assert len(prompts[split]) == len(tasks) >= 150
        own = {it.name for it in world.split_items(split)}
        assert all({it.name for it in _named(world, p)} <= own for p in prompts[split])
        assert max(len(p) for p in prompts[split]) <= 200  # short prompts, for a CPU policy
    assert not prompts["train"] & prompts["test"]


def test_every_seed_keeps_150_tasks_per_split_and_level():
    for seed in range(8):
        sizes = {(s, k): family_size("purchase", seed, s, k) for s in SPLITS for k in LEVELS}
        assert min(sizes.values()) >= 150, (seed, sizes)


def test_the_world_is_the_same_per_seed_and_differs_between_seeds():
    built = purchase_world(3)
    purchase_world.cache_clear()
    assert purchase_world(3) == built and purchase_world(3) != purchase_world(4)
    a, b = _env(3, seed=3), _env(3, seed=4)
    assert [t.prompt for t in _tasks(a, "train")] == [
        t.prompt for t in _tasks(_env(3, seed=3), "train")
    ]
    assert a.load_task("purchase/train/0") != b.load_task("purchase/train/0")


# -- the tools through env.step -------------------------------------------------------


def test_unknown_names_are_tool_errors_naming_them_and_the_episode_goes_on():
    env = _env(1)
    env.reset(options={"task_id": "purchase/test/0"})
    bad = [ToolCall("price", {"item": "lampp"}), ToolCall("discount", {"supplier": "Nobody"})]
    bad.append(ToolCall("tax", {"city": "Atlantis"}))
    obs, _, terminated, truncated, info = env.step("\n".join(HERMES.render_call(c) for c in bad))
    assert not terminated and not truncated and info["tool_errors"] == {"tool_raised": 3}
    texts = [m["content"] for m in obs]
    assert "no item 'lampp'; items look like" in texts[0]
    assert "no supplier 'Nobody'; suppliers look like" in texts[1]
    assert "no city 'Atlantis'; cities look like" in texts[2]
    _, parts, (*_, terminated, _, info) = play(env, env.demonstration(env.task))
    assert terminated and info["correct"] and info["episode_parts"]["tool"] == 1.0


def test_lookups_ignore_case_and_surrounding_whitespace():
    env = _env(1)
    env.reset(options={"task_id": "purchase/train/2"})
    (price, calc), answer = env.reference_solution("purchase/train/2")
    shouted = ToolCall("price", {"item": f"  {price.arguments['item'].upper()}\t"})
    obs, *_ = env.step(HERMES.render_call(shouted))
    assert obs[0]["content"] in calc.arguments["expression"]
    _, _, (*_, info) = play(env, [HERMES.render_call(calc), f"\\boxed{{{answer}}}"])
    assert info["correct"] and info["episode_parts"]["tool"] == 1.0


FUZZ_ENV = _env(1)


@settings(max_examples=300, deadline=None)
@given(tool=st.sampled_from(sorted(LOOKUPS)), name=st.text(max_size=80))
def test_any_text_as_a_lookup_argument_gives_a_value_or_a_tool_error(tool, name):
    FUZZ_ENV.reset(options={"task_id": "purchase/train/0"})
    call = HERMES.render_call(ToolCall(tool, {LOOKUPS[tool]: name}))
    obs, _, terminated, _, info = FUZZ_ENV.step(call)
    assert not terminated and len(obs) == 1 and isinstance(obs[0]["content"], str)
    if not info["tool_errors"]:  # the name was found: the world's value, however it was cased
        run = {t.name: t for t in purchase_tools(FUZZ_ENV.seed)}
        assert obs[0]["content"] == run[tool](name)


# -- wiring: not a default family, its tools, the checkers -------------------------------


def test_purchase_is_valid_but_not_a_default_family():
    assert FAMILIES == ("calculator", "sql", "chain") and "purchase" in ALL_FAMILIES
    obs, info = ToolCallEnv().reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == ["calculator", "sql"]
    assert "lookup tools" not in obs[0]["content"]
    obs, info = _env().reset(seed=0)
    names = [t["function"]["name"] for t in info["tools"]]
    assert names == [
        "calculator",
        "price",
        "supplier",
        "weight",
        "discount",
        "city",
        "tax",
        "weather",
    ]
    assert "lookup tools" in obs[0]["content"] and info["task_id"].startswith("purchase/")
    with pytest.raises(ValueError, match="calculator.*sql.*chain.*purchase"):
        ToolCallEnv(families=["purchase", "poetry"])


@pytest.mark.parametrize("level", LEVELS)
def test_the_checkers_pass_at_every_level(level):
    env = gym.make("agentgym/ToolCall-v0", families=["purchase"], difficulty=level)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*is different from the unwrapped version.*")
        check_env(env.unwrapped)
        check_agent_env(env)
