"""`MathEnv`'s difficulty levels and dataset configs: which reasoning-gym config builds each task.

A dataset's config is its level's settings with the user's `dataset_config`
on top (the user's fields win). Level 1 is reasoning-gym's default config for
every dataset: the tasks `MathEnv` has always served. Above it:

- The five `GENERATORS` follow `LEVEL_CONFIGS`, a table written for them:
  more terms and digits for the arithmetic ones, more animals and more of each
  for `leg_counting`. Division leaves `basic_arithmetic` above level 1, because
  reasoning-gym finds an exact divisor by trial division up to the square root
  of the dividend: with 5 or more terms of 3 or more digits, products make
  dividends whose search takes seconds to hours.
  `gsm_symbolic` supports only reasoning-gym's difficulty 1.0, so it is the same
  at every level.
- Any other dataset with a reasoning-gym curriculum takes the curriculum's
  level `difficulty - 1` (each attribute capped at its last), on reasoning-gym's
  own scale, which is not always above the defaults; pin fields with
  `dataset_config`. A dataset without a curriculum has only level 1.

reasoning-gym takes about two seconds to import, so it is imported only when a
name or a config has to be checked against it, never for the `GENERATORS`
at level 1 without a config of the user's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.env.core import check_difficulty as check_level
from agentgym.extras import need

LEVELS = 5
"""Difficulty levels run from 1 (reasoning-gym's defaults) to `LEVELS`."""

GENERATORS: tuple[str, ...] = (
    "gsm_symbolic",
    "basic_arithmetic",
    "chain_sum",
    "products",
    "leg_counting",
)
"""reasoning-gym datasets whose answers are numbers math-verify can judge."""

_BASIC = {"operators": ["+", "-", "*"]}  # no division above level 1: see the module docstring

LEVEL_CONFIGS: Mapping[str, tuple[Mapping[str, Any], ...]] = {
    "gsm_symbolic": ({},) * LEVELS,
    "basic_arithmetic": (
        {},  # 2-6 terms of 1-4 digits, + - * /, parentheses and negation
        {**_BASIC, "min_terms": 4, "max_terms": 7, "min_digits": 2, "max_digits": 4},
        {**_BASIC, "min_terms": 5, "max_terms": 8, "min_digits": 3, "max_digits": 4},
        {**_BASIC, "min_terms": 6, "max_terms": 10, "min_digits": 3, "max_digits": 5},
        {**_BASIC, "min_terms": 8, "max_terms": 12, "min_digits": 4, "max_digits": 5},
    ),
    "chain_sum": (
        {},  # 2-6 terms of 1-4 digits
        {"min_terms": 4, "max_terms": 8, "min_digits": 2, "max_digits": 5},
        {"min_terms": 6, "max_terms": 10, "min_digits": 3, "max_digits": 6},
        {"min_terms": 8, "max_terms": 12, "min_digits": 4, "max_digits": 7},
        {"min_terms": 10, "max_terms": 15, "min_digits": 5, "max_digits": 8},
    ),
    "products": (
        {},  # 2 factors of 1-5 digits
        {"min_terms": 2, "max_terms": 3, "min_digits": 2, "max_digits": 5},
        {"min_terms": 3, "max_terms": 3, "min_digits": 2, "max_digits": 5},
        {"min_terms": 3, "max_terms": 4, "min_digits": 3, "max_digits": 6},
        {"min_terms": 4, "max_terms": 5, "min_digits": 4, "max_digits": 6},
    ),
    "leg_counting": (
        {},  # 3-10 kinds of animal, 1-15 of each
        {"min_animals": 5, "max_animals": 15, "min_instances": 5, "max_instances": 30},
        {"min_animals": 10, "max_animals": 20, "min_instances": 10, "max_instances": 60},
        {"min_animals": 15, "max_animals": 28, "min_instances": 20, "max_instances": 120},
        {"min_animals": 20, "max_animals": 37, "min_instances": 50, "max_instances": 250},
    ),
}
"""reasoning-gym config fields per level (index 0 is level 1) of the `GENERATORS`."""

_SET_BY_ENV = ("seed", "size")


def check_difficulty(difficulty: Any) -> int:
    """`difficulty` if it is a level (1 to `LEVELS`); ValueError naming the range otherwise."""
    return check_level(difficulty, LEVELS)


def registered_datasets() -> tuple[str, ...]:
    """The names of the installed reasoning-gym datasets, sorted, but `composite`: a mixture
    of other datasets, which `generators` already makes, configured by objects, not data."""
    DATASETS = need("reasoning_gym.factory", "agentgym/Math-v0").DATASETS

    return tuple(sorted(name for name in DATASETS if name != "composite"))


def check_generators(generators: Sequence[str]) -> tuple[str, ...]:
    """The generators as a tuple; ValueError if one is not a reasoning-gym dataset, or repeats."""
    if isinstance(generators, str):
        generators = (generators,)
    generators = tuple(generators)
    if not generators or any(g not in GENERATORS for g in generators):
        valid = registered_datasets()
        if not generators or any(g not in valid for g in generators):
            raise ValueError(
                f"generators={generators!r}; valid: a non-empty subset of reasoning-gym's "
                f"datasets {valid}"
            )
    if len(set(generators)) != len(generators):
        raise ValueError(f"generators={generators!r} repeats a name")
    return generators


def _curriculum_fields(name: str, difficulty: int) -> dict[str, Any]:
    """The fields a dataset's reasoning-gym curriculum sets at `difficulty`."""
    from reasoning_gym.coaching.attributes import RangeAttributeDefinition
    from reasoning_gym.factory import create_curriculum, has_curriculum

    if not has_curriculum(name):
        raise ValueError(
            f"difficulty={difficulty}: reasoning-gym has no curriculum for {name!r}, so it has "
            "only level 1; use difficulty=1 and set its config in dataset_config"
        )
    curriculum = create_curriculum(name)
    curriculum.set_global_level(difficulty - 1)
    config = curriculum.generate_configuration()
    fields: dict[str, Any] = {}
    for attr in curriculum.attributes.values():
        if isinstance(attr, RangeAttributeDefinition):
            names = [attr.lower_field_name, attr.upper_field_name]
        else:
            names = [attr.field_name]
        fields.update({n: getattr(config, n) for n in names})
    return fields


def level_fields(name: str, difficulty: int) -> dict[str, Any]:
    """The config fields that `difficulty` sets for dataset `name` (none at level 1)."""
    if difficulty == 1:
        return {}
    if name in LEVEL_CONFIGS:
        return dict(LEVEL_CONFIGS[name][difficulty - 1])
    return _curriculum_fields(name, difficulty)


def _check_fields(name: str, config: Any) -> dict[str, Any]:
    """A user's config for dataset `name`, its keys checked against the dataset's config class."""
    from reasoning_gym.factory import DATASETS

    if not isinstance(config, Mapping):
        raise ValueError(f"dataset_config[{name!r}] is {config!r}; valid: a mapping of fields")
    fields = [f.name for f in dataclasses.fields(DATASETS[name][1]) if f.init]
    valid = [f for f in fields if f not in _SET_BY_ENV]
    for key in config:
        if key not in valid:
            why = "is set by the env (train_size, test_size, seed)" if key in fields else "unknown"
            raise ValueError(
                f"dataset_config[{name!r}] has key {key!r}: {why}; valid keys of {name}: {valid}"
            )
    return dict(config)


def dataset_configs(
    generators: tuple[str, ...], difficulty: int, user: Mapping[str, Any] | None
) -> dict[str, str]:
    """Each generator's config at `difficulty` with the user's fields on top, as sorted JSON.

    JSON makes a config hashable (a cache key) and proves it plain data.
    Raises ValueError for a config of a dataset not in `generators`, an
    unknown or reserved key, or a value that is not plain data.
    """
    user = {} if user is None else user
    if not isinstance(user, Mapping):
        raise ValueError(f"dataset_config={user!r}; valid: a mapping from generator to config")
    stray = [name for name in user if name not in generators]
    if stray:
        raise ValueError(
            f"dataset_config names {stray}, not in generators {generators}; "
            "add them to generators or drop their configs"
        )
    configs = {}
    for name in generators:
        fields = level_fields(name, difficulty)
        if name in user:
            fields.update(_check_fields(name, user[name]))
        try:
            configs[name] = json.dumps(fields, sort_keys=True)
        except TypeError as err:
            raise ValueError(f"dataset_config[{name!r}] is not plain data: {err}") from None
    return configs
