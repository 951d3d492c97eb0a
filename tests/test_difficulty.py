"""Difficulty levels of Math-v0 and ToolCall-v0: level 1 is the original tasks, higher levels
are harder and still solvable, reasoning-gym datasets pass through with their configs."""

import re
import warnings
from decimal import ROUND_HALF_UP, Decimal

import gymnasium as gym
import pytest
from episodes import play
from gymnasium.utils.env_checker import check_env

import agentgym  # noqa: F401  (registers the built-in environments)
from agentgym.env.checker import check_agent_env
from agentgym.envs.math.env import GENERATORS, MathEnv
from agentgym.envs.tool_call.calculator import calculate
from agentgym.envs.tool_call.env import ToolCallEnv
from agentgym.envs.tool_call.tasks import FAMILIES
from agentgym.tools import HERMES

LEVELS = [1, 2, 3, 4, 5]
SPLITS = ["train", "test"]

# -- level 1 is the original tasks (literals copied from the envs before levels existed) ---

MATH_LEVEL_1 = {
    "gsm_symbolic/train/0": (
        "A carpenter works for 2 weeks every month and for 6 days every week. If he gets paid "
        "£195 every day, how much does he earn if he works for a year? Give the result as your "
        "final answer. Do not include units.",
        "28080",
    ),
    "basic_arithmetic/train/0": (
        "Calculate -1515 / 5 + -( -2842 * -5436 ) * -6892.",
        "106475279601",
    ),
    "basic_arithmetic/test/7": ("Calculate -( -867 * -121 ) * 633.", "-66406131"),
    "chain_sum/train/0": (
        "State the final answer to the following arithmetic problem: "
        "1663 - 5242 - 9376 - 8961 + 7634 =",
        "-14282",
    ),
    "chain_sum/test/7": (
        "State the final answer to the following arithmetic problem: 451 - 918 + 163 =",
        "-304",
    ),
    "products/test/7": (
        "Solve the following multiplication: 451 * 918. Give only the result as your final answer.",
        "414018",
    ),
    "leg_counting/test/7": (
        "Your task is to count how many legs there are in total when given a list of animals.\n\n"
        "Now, how many legs are there in total if you have 10 butterflys, 13 ants, 6 flatworms, "
        "10 bees, 13 lobsters, 11 leechs?\n",
        "328",
    ),
}

_SPEND = (
    "SELECT SUM(o.quantity * p.price) FROM orders o JOIN customers c ON c.id = o.customer_id "
    "JOIN products p ON p.id = o.product_id WHERE c.name = '{}' AND o.order_date LIKE '2022-%'"
)
TOOL_CALL_LEVEL_1 = {
    "calculator/train/0": (
        "What is 9412 * 6417 + 4579 * 3116?",
        "74664968",
        [("calculator", {"expression": "9412 * 6417 + 4579 * 3116"})],
    ),
    "calculator/test/3": (
        "What is (75008 - 3713) * 1260 / 30?",
        "2994390",
        [("calculator", {"expression": "(75008 - 3713) * 1260 / 30"})],
    ),
    "sql/train/3": (
        "How many orders did customer 'Hana Singh' place in 2023?",
        "2",
        [
            (
                "sql",
                {
                    "query": "SELECT COUNT(*) FROM orders o JOIN customers c ON c.id = "
                    "o.customer_id WHERE c.name = 'Hana Singh' AND o.order_date LIKE '2023-%'"
                },
            )
        ],
    ),
    "chain/train/0": (
        "What did customer 'Georg Larsen' pay for all their orders placed in 2022 (quantity "
        "times unit price), with 12% sales tax added on top? Give the amount rounded to 2 "
        "decimal places.",
        "554.76",
        [
            ("sql", {"query": _SPEND.format("Georg Larsen")}),
            ("calculator", {"expression": "495.32 * 1.12"}),
        ],
    ),
    "chain/test/3": (
        "What did customer 'Georg Novak' pay for all their orders placed in 2022 (quantity "
        "times unit price), with 7.25% sales tax added on top? Give the amount rounded to 2 "
        "decimal places.",
        "1183.18",
        [
            ("sql", {"query": _SPEND.format("Georg Novak")}),
            ("calculator", {"expression": "1103.2 * 1.0725"}),
        ],
    ),
}


@pytest.mark.parametrize("kwargs", [{}, {"difficulty": 1}], ids=["default", "level-1"])
def test_math_level_1_is_the_original_tasks(kwargs):
    env = MathEnv(generators=GENERATORS, **kwargs)
    for task_id, (prompt, answer) in MATH_LEVEL_1.items():
        task = env.load_task(task_id)
        assert (task.prompt, task.answer) == (prompt, answer), task_id


@pytest.mark.parametrize("kwargs", [{}, {"difficulty": 1}], ids=["default", "level-1"])
def test_tool_call_level_1_is_the_original_tasks(kwargs):
    env = ToolCallEnv(**kwargs)
    sizes = {f"{f}/{s}": env._size(f, s) for f in ("sql", "chain") for s in SPLITS}
    assert sizes == {"sql/train": 130, "sql/test": 129, "chain/train": 632, "chain/test": 629}
    for task_id, (prompt, answer, calls) in TOOL_CALL_LEVEL_1.items():
        found, solution = env.load_task(task_id), env.reference_solution(task_id)
        assert (found.prompt, found.answer) == (prompt, answer), task_id
        assert [(c.name, c.arguments) for c in solution[0]] == calls and solution[1] == answer


# -- Math-v0: harder levels ---------------------------------------------------------


def _numbers(text):
    return re.findall(r"\d+", text)


# (terms, digits) ranges per level, by hand from the table in envs/math/levels.py
CHAIN_SUM = {1: ((2, 6), (1, 4)), 3: ((6, 10), (3, 6)), 5: ((10, 15), (5, 8))}
PRODUCTS = {1: ((2, 2), (1, 5)), 3: ((3, 3), (2, 5)), 5: ((4, 5), (4, 6))}


@pytest.mark.parametrize(("generator", "table"), [("chain_sum", CHAIN_SUM), ("products", PRODUCTS)])
@pytest.mark.parametrize("level", [1, 3, 5])
def test_math_levels_set_the_terms_and_digits(generator, table, level):
    env = MathEnv(generators=[generator], difficulty=level, train_size=40, test_size=40)
    (low, high), (few, many) = table[level]
    for split in SPLITS:
        for index in range(40):
            numbers = _numbers(env.load_task(f"{generator}/{split}/{index}").prompt)
            assert low <= len(numbers) <= high, numbers
            assert all(few <= len(n) <= many or n == "0" for n in numbers), numbers


def test_math_higher_levels_ask_for_more():
    sizes = {}
    for level in LEVELS:
        env = MathEnv(generators=["basic_arithmetic", "leg_counting"], difficulty=level)
        prompts = [env.load_task(f"{g}/test/{i}").prompt for g in env.generators for i in range(30)]
        sizes[level] = sum(len(_numbers(p)) for p in prompts)
    assert [sizes[level] for level in LEVELS] == sorted(sizes.values())
    assert sizes[5] > 3 * sizes[1]
    arithmetic = MathEnv(generators=["basic_arithmetic"], difficulty=5)
    for index in range(20):
        assert len(_numbers(arithmetic.load_task(f"basic_arithmetic/train/{index}").prompt)) >= 8


@pytest.mark.parametrize("level", LEVELS)
def test_each_math_level_judges_its_own_answers_correct(level):
    env = MathEnv(generators=GENERATORS, difficulty=level, train_size=50, test_size=50)
    for generator in GENERATORS:
        for task_id in (f"{generator}/train/{level}", f"{generator}/test/{level}"):
            env.reset(options={"task_id": task_id})
            _, reward, _, _, info = env.step(f"So \\boxed{{{env.task.answer}}}")
            assert info["correct"] and reward == pytest.approx(1.03), (task_id, info)


@pytest.mark.parametrize("level", [1, 3, 5])
def test_math_splits_stay_disjoint_at_every_level(level):
    env = MathEnv(generators=GENERATORS, difficulty=level, train_size=200, test_size=200)
    prompts = {
        split: {env.load_task(env.task_id(split, i)).prompt for i in range(env.num_tasks(split))}
        for split in SPLITS
    }
    assert len(prompts["test"]) > 500 and not prompts["train"] & prompts["test"]


# -- Math-v0: any reasoning-gym dataset, with its config ----------------------------


def _word_sorting(**kwargs):
    config = {"word_sorting": {"min_words": 3, "max_words": 4}}
    return MathEnv(
        generators=["word_sorting", "chain_sum"], dataset_config=config, train_size=30, **kwargs
    )


def test_a_passed_through_dataset_takes_its_config_and_its_own_scoring():
    env = _word_sorting()
    env.reset(options={"task_id": "word_sorting/train/2"})
    words = env.task.prompt.rsplit(":", 1)[1].strip().split(", ")
    assert 3 <= len(words) <= 4 and sorted(env.task.answer.split(", ")) == sorted(words)
    _, _, _, _, info = env.step(f"\\boxed{{{env.task.answer}}}")
    assert info["correct"] and info["reward_parts"] == {"correctness": 1.0, "format": 0.3}
    env.reset(options={"task_id": "word_sorting/train/2"})
    words = env.task.answer.split(", ")
    shuffled = ", ".join(words[1:] + words[:1])  # no word in its place
    _, _, _, _, info = env.step(f"\\boxed{{{shuffled}}}")
    # word_sorting's own score: 0.2 for the right words in a wrong order
    assert not info["correct"] and info["reward_parts"]["correctness"] == pytest.approx(0.2)
    env.reset(options={"task_id": "word_sorting/test/0"})
    _, _, _, _, info = env.step(env.task.answer)
    assert info["reward_parts"]["correctness"] == -1.0


def test_a_passed_through_dataset_uses_its_curriculum_above_level_1():
    env = MathEnv(generators=["word_sorting"], difficulty=3)
    assert env.configs["word_sorting"] == (
        '{"max_word_length": 15, "max_words": 50, "min_word_length": 3, "min_words": 5}'
    )
    assert MathEnv(generators=["word_sorting"]).configs["word_sorting"] == "{}"
    pinned = MathEnv(
        generators=["word_sorting"],
        difficulty=3,
        dataset_config={"word_sorting": {"max_words": 6}},
    )
    assert '"max_words": 6' in pinned.configs["word_sorting"]


def test_a_config_for_a_default_generator_changes_its_tasks():
    plain = MathEnv().load_task("basic_arithmetic/train/0").prompt
    env = MathEnv(dataset_config={"basic_arithmetic": {"min_terms": 3, "max_terms": 3}})
    assert env.load_task("basic_arithmetic/train/0").prompt == "Calculate -1515 / 101 + -61."
    assert plain != env.load_task("basic_arithmetic/train/0").prompt


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"generators": ["chain_sum", "nope"]}, "generators=.*valid: .*'word_sorting'"),
        ({"dataset_config": {"chain_sum": {"bogus": 1}}}, "'chain_sum'.* key 'bogus'"),
        ({"dataset_config": {"chain_sum": {"seed": 3}}}, "'chain_sum'.* key 'seed': is set by"),
        ({"dataset_config": {"products": {}}}, "names \\['products'\\], not in generators"),
        ({"dataset_config": {"chain_sum": {"min_terms": 0}}}, "'chain_sum'.*min_terms must be"),
        ({"dataset_config": ["chain_sum"]}, "dataset_config=\\['chain_sum'\\]"),
        ({"generators": ["acre"], "difficulty": 2}, "no curriculum for 'acre'"),
    ],
)
def test_bad_datasets_and_configs_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MathEnv(**kwargs)


# -- ToolCall-v0: every level solvable by its reference solution ------------------------


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("family", FAMILIES)
def test_the_reference_solution_scores_the_maximum_at_every_level(level, family):
    env = gym.make("agentgym/ToolCall-v0", difficulty=level)
    for split in SPLITS:
        for index in (0, 1, 7):
            task_id = f"{family}/{split}/{index}"
            env.reset(options={"task_id": task_id})
            calls, answer = env.unwrapped.reference_solution(task_id)
            turns = env.unwrapped.demonstration(env.unwrapped.task)
            assert turns[:-1] == [HERMES.render_call(c) for c in calls] and answer in turns[-1]
            total, parts, (*_, terminated, truncated, info) = play(env, turns)
            assert terminated and not truncated and info["correct"], (task_id, info)
            assert parts == pytest.approx({"correctness": 1.0, "tool": 1.0, "format": 0.3})


def _run(env, call):
    if call.name == "calculator":
        return calculate(call.arguments["expression"])
    header, *rows = env.store.run(call.arguments["query"]).splitlines()
    assert len(rows) == 1, rows
    return rows[0]


@pytest.mark.parametrize("level", LEVELS)
def test_each_reference_call_feeds_the_next_and_the_last_gives_the_answer(level):
    env = ToolCallEnv(difficulty=level)
    for family in FAMILIES:
        for split in SPLITS:
            for index in range(0, env._size(family, split), 11)[:12]:
                task = env.load_task(f"{family}/{split}/{index}")
                calls, out = task.metadata["reference_calls"], None
                for call in calls:
                    if out is not None:  # this step uses the last one's result
                        assert out in next(iter(call.arguments.values())), (task, out)
                    out = _run(env, call)
                if family == "chain":
                    out = str(Decimal(out).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))
                assert out == task.answer, task


def _reference(env, family, split="test", count=12):
    return [
        env.load_task(f"{family}/{split}/{i}").metadata["reference_calls"]
        for i in range(min(count, env._size(family, split)))
    ]


def test_calculator_levels_have_more_and_larger_operands():
    operands = {}
    for level in LEVELS:
        for calls in _reference(ToolCallEnv(difficulty=level), "calculator", count=40):
            numbers = _numbers(calls[0].arguments["expression"])
            operands.setdefault(level, []).append(len(numbers))
    assert min(operands[1]) >= 3 and max(operands[1]) <= 4
    assert set(operands[2]) == {5} and set(operands[3]) == {6}
    assert min(operands[4]) >= 7 and min(operands[5]) >= 9


def test_sql_levels_ask_harder_queries():
    queries = {
        level: [
            calls[0].arguments["query"]
            for calls in _reference(ToolCallEnv(difficulty=level), "sql", count=60)
        ]
        for level in LEVELS
    }
    assert all(q.count("JOIN") == 1 for q in queries[1])
    assert all(q.count("JOIN") == 2 and q.count(" = '") == 2 for q in queries[2])
    assert all("GROUP BY" in q or "DISTINCT" in q for q in queries[3])
    assert all("o.quantity * p.price" in q and q.count("JOIN") == 2 for q in queries[4])
    assert all("GROUP BY" in q or "AVG(" in q for q in queries[5])


def test_chain_levels_take_more_dependent_steps():
    steps = {
        level: {len(calls) for calls in _reference(ToolCallEnv(difficulty=level), "chain")}
        for level in LEVELS
    }
    assert steps == {1: {2}, 2: {3}, 3: {4}, 4: {4}, 5: {4}}
    lookups = {
        level: {
            sum(c.name == "sql" for c in calls)
            for calls in _reference(ToolCallEnv(difficulty=level), "chain")
        }
        for level in LEVELS
    }
    assert lookups == {1: {1}, 2: {2}, 3: {2}, 4: {3}, 5: {3}}


@pytest.mark.parametrize("level", [2, 3, 4, 5])
def test_tool_call_splits_stay_disjoint_at_every_level(level):
    env = ToolCallEnv(difficulty=level)
    for family in FAMILIES:
        count = {"calculator": 500}.get(family)
        prompts = {
            split: {
                env.load_task(f"{family}/{split}/{i}").prompt
                for i in range(count or env._size(family, split))
            }
            for split in SPLITS
        }
        assert len(prompts["train"]) > 50 and len(prompts["test"]) > 50, family
        assert not prompts["train"] & prompts["test"], family
    # by construction: a calculator expression's numbers sum to an even number in train only
    for split, parity in (("train", 0), ("test", 1)):
        for prompt in (env.load_task(f"calculator/{split}/{i}").prompt for i in range(200)):
            assert sum(map(int, _numbers(prompt))) % 2 == parity, prompt


# -- both: bad levels refused, checkers pass at every level ---------------------------


@pytest.mark.parametrize("env_class", [MathEnv, ToolCallEnv])
@pytest.mark.parametrize("bad", [0, 6, 7, -1, "hard", True, 2.0, None])
def test_a_bad_difficulty_is_named_with_the_valid_range(env_class, bad):
    with pytest.raises(
        ValueError, match=f"difficulty={re.escape(repr(bad))}; valid: an int from 1 to 5"
    ):
        env_class(difficulty=bad)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("env_id", ["agentgym/Math-v0", "agentgym/ToolCall-v0"])
def test_the_checkers_pass_at_every_level(env_id, level):
    env = gym.make(env_id, difficulty=level)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*is different from the unwrapped version.*")
        check_env(env.unwrapped)
        check_agent_env(env)
    assert env.unwrapped.difficulty == level
