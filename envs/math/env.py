"""`MathEnv`: one-turn math problems from reasoning-gym, judged by math-verify.

Each episode is one problem. The agent reasons and ends with `\\boxed{ANSWER}`;
the reward is the tutorial's `math_reward + 0.1 * format_reward`. The numeric
datasets of `GENERATORS` are judged by math-verify; any other reasoning-gym
dataset by its own `score_answer` on the boxed answer (-1.0 without one).
`difficulty` and `dataset_config` choose each dataset's config (`levels.py`).

Tasks are procedural and offline. reasoning-gym builds item `i` of a dataset
from `Random(seed + i)`, so each split reads its own stream of seeds, `_STREAM`
apart, and the streams never share a generator state. Small problem spaces
still repeat question texts across streams, so a train item whose question is
in the test set is redrawn from the next stream, deterministically: train and
test are disjoint in question text, and a task id always names the same task.
"""

from __future__ import annotations

import functools
import json
import re
import types
from collections.abc import Mapping, Sequence
from typing import Any, cast

from agentgym.env.core import SPLITS, AgentEnv, Feedback, Split, Task, interleave
from agentgym.envs.math.levels import (
    GENERATORS,
    LEVELS,
    check_difficulty,
    check_generators,
    dataset_configs,
)
from agentgym.extras import need, require
from agentgym.rewards.verifiable import Format, combine, extract_boxed, format_reward, math_reward

__all__ = ["DEFAULT_GENERATORS", "GENERATORS", "MathEnv"]

DEFAULT_GENERATORS: tuple[str, ...] = ("gsm_symbolic", "basic_arithmetic", "chain_sum")

_STREAM = 2**32  # seed distance between streams; seed + index stays below it
_MAX_REDRAWS = 64
_TASK_ID = re.compile(r"(?P<generator>\w+)/(?P<split>\w+)/(?P<index>\d+)")


@functools.lru_cache(maxsize=256)
def _dataset(name: str, size: int, seed: int, config: str) -> Any:
    """A reasoning-gym dataset; items are generated on access, so this is cheap.

    `config` holds the dataset's config fields as JSON (a hashable cache key).
    """
    reasoning_gym = need("reasoning_gym", "agentgym/Math-v0")  # ~2 s: when first needed

    return reasoning_gym.create_dataset(name, size=size, seed=seed, **json.loads(config))


@functools.lru_cache(maxsize=256)
def _test_questions(name: str, size: int, seed: int, config: str) -> frozenset[str]:
    """The question texts of a generator's test split."""
    dataset = _dataset(name, size, seed + _STREAM, config)
    return frozenset(dataset[i]["question"] for i in range(size))


def _item(
    name: str, split: Split, index: int, sizes: dict[str, int], seed: int, config: str
) -> dict:
    """The reasoning-gym item behind one task id (a dict with question and answer)."""
    if split == "test":
        return _dataset(name, sizes["test"], seed + _STREAM, config)[index]
    held_out = _test_questions(name, sizes["test"], seed, config)
    for redraw in range(_MAX_REDRAWS):
        stream = 0 if redraw == 0 else redraw + 1  # stream 1 is the test split's
        item = _dataset(name, sizes["train"], seed + stream * _STREAM, config)[index]
        if item["question"] not in held_out:
            return item
    raise RuntimeError(
        f"{name}/train/{index}: {_MAX_REDRAWS} draws all repeat test questions; "
        "the generator's problem space is too small for this test_size"
    )


def _check_size(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**31:
        raise ValueError(f"{field}={value!r}; valid: an int from 1 to 2**31 - 1")
    return value


def _scorer(name: str, seed: int, config: str) -> Any:
    """A one-item copy of a dataset with the env's config, for its `score_answer`."""
    return _dataset(name, 1, seed + _STREAM, config)


def _check_config(name: str, config: str, difficulty: int, seed: int) -> None:
    """Builds the dataset once, so that reasoning-gym refuses a bad config now, by name."""
    if config == "{}" and name in GENERATORS:
        return  # reasoning-gym's defaults, known good: no need to import it yet
    try:
        _scorer(name, seed, config)
    except (AssertionError, AttributeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"reasoning-gym cannot build {name!r} at difficulty={difficulty} with config "
            f"{config}: {err or type(err).__name__}"
        ) from None


class MathEnv(AgentEnv):
    """Word problems and arithmetic with a boxed final answer; one step per episode.

    Task ids read `"<generator>/<split>/<index>"`, e.g. `"basic_arithmetic/train/17"`.
    The splits interleave the generators, so a seed picks any of them.

    Args:
        generators: reasoning-gym datasets to draw from: any installed one
            (`levels.registered_datasets()`); `GENERATORS` are the numeric ones.
        train_size: Problems per generator in the train split.
        test_size: Problems per generator in the test split (held out).
        seed: Seed of the problem streams; the same seed gives the same tasks.
        system_prompt: The system message; None for `default_system_prompt`.
        render_mode: None or "ansi".
        difficulty: 1 to `levels.LEVELS`; 1 is reasoning-gym's default configs
            (see `levels.py` for what each level sets).
        dataset_config: Config fields per generator, e.g.
            `{"basic_arithmetic": {"min_terms": 3}}`, on top of the level's.
    """

    default_system_prompt = (
        "Solve the problem. Reason step by step, then give the final answer as \\boxed{ANSWER}."
    )
    formats: tuple[Format, ...] = ("boxed",)
    """What counts as well-formed: reasoning ended by one boxed answer."""
    reward_weights = types.MappingProxyType({"correctness": 1.0, "format": 0.1})
    difficulty_levels = LEVELS

    def __init__(
        self,
        generators: Sequence[str] = DEFAULT_GENERATORS,
        train_size: int = 10_000,
        test_size: int = 300,
        seed: int = 0,
        system_prompt: str | None = None,
        render_mode: str | None = None,
        difficulty: int = 1,
        dataset_config: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        super().__init__(system_prompt=system_prompt, render_mode=render_mode)
        require("reasoning_gym", "agentgym/Math-v0")
        self.generators = check_generators(generators)
        self.sizes = {
            "train": _check_size("train_size", train_size),
            "test": _check_size("test_size", test_size),
        }
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
            raise ValueError(f"seed={seed!r}; valid: an int from 0 to 2**31 - 1")
        self.seed = seed
        self.dataset_config = dataset_config
        self.base_difficulty = self.difficulty = check_difficulty(difficulty)
        self.configs = self._configs_at(self.difficulty)
        self._levels = {self.difficulty: self.configs}

    def _configs_at(self, difficulty: int) -> dict[str, str]:
        configs = dataset_configs(self.generators, difficulty, self.dataset_config)
        for name, config in configs.items():
            _check_config(name, config, difficulty, self.seed)
        return configs

    def select_difficulty(self, level: int | None) -> None:
        """Draws the next episode's task at `level` (each level's configs checked once)."""
        self.difficulty = self.base_difficulty if level is None else check_difficulty(level)
        if self.difficulty not in self._levels:
            self._levels[self.difficulty] = self._configs_at(self.difficulty)
        self.configs = self._levels[self.difficulty]

    def num_tasks(self, split: Split) -> int:
        return len(self.generators) * self.sizes[split]

    def task_id(self, split: Split, index: int) -> str:
        generator, k = interleave(self.generators, index, self.num_tasks(split))
        return f"{generator}/{split}/{k}"

    def load_task(self, task_id: str) -> Task:
        generator, split, index = self._parse_task_id(task_id)
        item = self._entry(generator, split, index)
        metadata = {"generator": generator, "split": split, "index": index}
        return Task(task_id, item["question"], answer=str(item["answer"]), metadata=metadata)

    def _entry(self, generator: str, split: Split, index: int) -> dict:
        return _item(generator, split, index, self.sizes, self.seed, self.configs[generator])

    def _parse_task_id(self, task_id: str) -> tuple[str, Split, int]:
        """(generator, split, index) of a task id; KeyError naming the id if it is none."""
        match = _TASK_ID.fullmatch(task_id) if isinstance(task_id, str) else None
        if (
            match is None
            or match["generator"] not in self.generators
            or match["split"] not in SPLITS
            or int(match["index"]) >= self.sizes[match["split"]]
        ):
            raise KeyError(
                f"no task {task_id!r}; ids read '<generator>/<split>/<index>' with generator in "
                f"{self.generators}, split in {SPLITS}, index below {self.sizes['train']} "
                f"(train) or {self.sizes['test']} (test)"
            )
        # the split was checked against SPLITS above
        return match["generator"], cast(Split, match["split"]), int(match["index"])

    def demonstration(self, task: Task) -> list[str]:
        """The answer in the expected format (SFT teaches the format, FAQ 1)."""
        return [f"The answer is \\boxed{{{task.answer}}}."]

    def correctness(self, task: Task, action: str) -> float:
        """-1.0 without a boxed answer; else math-verify's 1.0 or 0.0 for the numeric
        `GENERATORS`, or the dataset's own `score_answer` (0.0 to 1.0) for any other."""
        generator = task.metadata["generator"]
        if generator in GENERATORS:
            return math_reward(action, task.answer)
        extracted = extract_boxed(action)
        if extracted is None:
            return -1.0
        entry = self._entry(generator, task.metadata["split"], task.metadata["index"])
        scorer = _scorer(generator, self.seed, self.configs[generator])
        return float(scorer.score_answer(extracted, entry))

    def respond(self, action: str) -> Feedback:
        """Scores the boxed answer: `correctness + 0.1 * format_reward`; ends the episode."""
        assert self.task is not None  # step() checked it
        expected = self.task.answer
        parts = {
            "correctness": self.correctness(self.task, action),
            "format": format_reward(action, formats=self.formats),
        }
        info = {
            "correct": parts["correctness"] == 1.0,
            "format_ok": parts["format"] > 0,
            "expected_answer": expected,
            "extracted_answer": extract_boxed(action),
        }
        reward = combine(parts, self.reward_weights)
        return Feedback(messages=(), reward=reward, reward_parts=parts, terminated=True, info=info)
