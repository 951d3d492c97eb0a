"""BFCL v4's multi-turn tasks as the `bfcl-eval` wheel publishes them, read the way BFCL reads
them, and split by API class for training.

What is read, and from where in the wheel (`bfcl_eval/data/`):

- `BFCL_v4_<category>.json`: the entries (`id`, `question`: a list of user turns, each a list
  of messages; `initial_config`, `involved_classes`, and for `multi_turn_miss_func`
  `missed_function`: turn index -> names of functions withheld until that turn);
- `possible_answer/BFCL_v4_<category>.json`: the ground truth, a list of call strings per turn;
- `multi_turn_func_doc/*.json`: the function docs of each API class.

The functions an entry offers are built as `bfcl_eval.utils.populate_test_cases_with_
predefined_functions` and `add_language_specific_hint_to_function_doc` build them (that
module is not imported: at import it creates folders beside the installed package and needs
`filelock`): the docs of the involved classes in their order, the missed ones taken out and
kept per turn, and " Note that the provided function is in Python 3 syntax." added to the
description of the ones offered from the start (not to the missed ones, as in BFCL). The
schema the model sees is BFCL's function-calling conversion (`convert_to_tool` with
`GORILLA_TO_OPENAPI`, as for open models): "dict" -> "object", "float" -> "number" with
`format: float` and " This is a float type value." in the description, and so on. The
wheel's `excluded_function` field is read by none of the wheel's code, so it is ignored here
too. tests/test_bfcl_multi_turn.py compares these with the wheel's own functions.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from agentgym.extras import need

ENV_NAME = "agentgym/BFCLMultiTurn-v0"
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
DEFAULT_HELD_OUT: tuple[str, ...] = ("MathAPI", "TicketAPI")
"""The API classes held out of training by default: the two smallest (25 and 31 of 200
entries per category), so 56 entries of each category test and 144 train."""


def bfcl(module: str) -> Any:
    """A module of the bfcl_eval package (`bfcl_eval.<module>`), or the extra's error."""
    return need(f"bfcl_eval.{module}", ENV_NAME)


def categories_published() -> tuple[str, ...]:
    """BFCL's multi-turn categories, in BFCL's order (`MULTI_TURN_CATEGORY`)."""
    return tuple(bfcl("constants.category_mapping").MULTI_TURN_CATEGORY)


def classes_published() -> tuple[str, ...]:
    """The API classes the multi-turn categories use (those with a function doc file, less
    the memory and web-search ones of BFCL's agentic categories)."""
    config = bfcl("constants.executable_backend_config")
    return tuple(
        name
        for name in config.MULTI_TURN_FUNC_DOC_FILE_MAPPING
        if name not in config.OMIT_STATE_INFO_CLASSES
    )


@dataclass(frozen=True, eq=False)
class BfclEntry:
    """One published multi-turn entry with its ground truth and the functions it offers.

        `entry` is the question row as published (the checker reads its `id`,
        `initial_config` and `involved_classes`; never mutated); `functions` are the BFCL docs
        offered from the start (with BFCL's Python hint), `missed` the docs added at a turn.
    Compared and hashed by identity: `load_category` makes each once.
    """

    task_id: str
    category: str
    entry: Mapping[str, Any]
    ground_truth: tuple[tuple[str, ...], ...]
    functions: tuple[Mapping[str, Any], ...]
    missed: Mapping[int, tuple[Mapping[str, Any], ...]]

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(self.entry["involved_classes"])

    @property
    def turns(self) -> tuple[tuple[Mapping[str, str], ...], ...]:
        """The user turns: each a tuple of messages (a missed-function turn has none)."""
        return tuple(tuple(turn) for turn in self.entry["question"])


def data_file(*parts: str) -> Any:
    """A file under the wheel's `data/` folder."""
    bfcl("constants")  # the extra's error first, where the package is missing
    return resources.files("bfcl_eval").joinpath("data", *parts)


def read_lines(*parts: str) -> list[dict[str, Any]]:
    """A JSON-lines file of the wheel's data, one object per line."""
    path = data_file(*parts)
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


@functools.cache
def class_docs(class_name: str) -> tuple[Mapping[str, Any], ...]:
    """The function docs of one API class, as published."""
    mapping = bfcl("constants.executable_backend_config").MULTI_TURN_FUNC_DOC_FILE_MAPPING
    return tuple(read_lines("multi_turn_func_doc", mapping[class_name]))


def offered_functions(
    entry: Mapping[str, Any],
) -> tuple[tuple[dict[str, Any], ...], dict[int, tuple[dict[str, Any], ...]]]:
    """(docs offered from the start, {turn: docs added then}) as BFCL builds them; shallow
    copies of `class_docs`' (the hint changes only the description): never mutated."""
    functions = [dict(doc) for c in entry["involved_classes"] for doc in class_docs(c)]
    missed: dict[int, tuple[dict[str, Any], ...]] = {}
    for turn, names in entry.get("missed_function", {}).items():
        taken = []
        for name in names:
            for i, doc in enumerate(functions):
                if doc["name"] == name:
                    taken.append(functions.pop(i))
                    break
        missed[int(turn)] = tuple(taken)
    hinted = tuple({**doc, "description": doc["description"] + PYTHON_HINT} for doc in functions)
    return hinted, missed


def check_categories(categories: Sequence[str] | None) -> tuple[str, ...]:
    """The categories named (all of BFCL's multi-turn ones for None), checked."""
    published = categories_published()
    if categories is None:
        return published
    if isinstance(categories, str):
        categories = [categories]
    chosen = tuple(categories)
    unknown = [c for c in chosen if c not in published]
    if not chosen or unknown or len(set(chosen)) != len(chosen):
        problem = f"unknown {unknown!r}" if unknown else "empty or repeated"
        raise ValueError(
            f"categories={list(chosen)!r}: {problem}; valid: distinct names among "
            f"{', '.join(published)} (None: all)"
        )
    return chosen


@functools.cache
def load_category(category: str) -> tuple[BfclEntry, ...]:
    """A category's entries in published order; ValueError naming the file and id where the
    question and answer files disagree."""
    prefix = bfcl("constants.category_mapping").VERSION_PREFIX
    name = f"{prefix}_{category}.json"
    questions = read_lines(name)
    answers = read_lines("possible_answer", name)
    if [q["id"] for q in questions] != [a["id"] for a in answers]:
        raise ValueError(f"{name}: the ids of the questions and of possible_answer/ differ")
    entries = []
    for question, answer in zip(questions, answers, strict=True):
        truth = tuple(tuple(turn) for turn in answer["ground_truth"])
        if len(truth) != len(question["question"]):
            raise ValueError(
                f"{name}: {question['id']} has {len(question['question'])} turns and "
                f"{len(truth)} ground-truth turns"
            )
        functions, missed = offered_functions(question)
        entries.append(BfclEntry(question["id"], category, question, truth, functions, missed))
    return tuple(entries)


def check_held_out(held_out: Sequence[str]) -> tuple[str, ...]:
    """The held-out API classes, checked against the published ones."""
    published = classes_published()
    chosen = (held_out,) if isinstance(held_out, str) else tuple(held_out)
    unknown = [c for c in chosen if c not in published]
    if unknown or not chosen or set(chosen) == set(published):
        raise ValueError(
            f"held_out_classes={list(chosen)!r}: "
            f"{'unknown ' + repr(unknown) if unknown else 'none or all of them'}; valid: a "
            f"non-empty proper subset of {', '.join(published)}"
        )
    return chosen


@dataclass(frozen=True)
class Splits:
    """The task ids of each split, and every entry by id."""

    train: tuple[str, ...]
    test: tuple[str, ...]
    entries: Mapping[str, BfclEntry]


def make_splits(categories: Sequence[str], held_out: Sequence[str] | None) -> Splits:
    """Benchmark (held_out None): every entry is a test task, in published order. Training:
    an entry that involves a held-out class is a test task, any other a train task."""
    entries = [e for category in categories for e in load_category(category)]
    by_id = {e.task_id: e for e in entries}
    if held_out is None:
        return Splits((), tuple(by_id), by_id)
    test = tuple(e.task_id for e in entries if set(e.classes) & set(held_out))
    train = tuple(e.task_id for e in entries if not set(e.classes) & set(held_out))
    return Splits(train, test, by_id)


def openai_tool(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A BFCL function doc as BFCL's `convert_to_tool(..., GORILLA_TO_OPENAPI, OSSMODEL)`
    gives it to a function-calling model, in the OpenAI `{"type": "function"}` wrapper."""
    item = copy.deepcopy(dict(doc))
    item["name"] = item["name"].replace(".", "_")
    item["parameters"]["type"] = "object"
    item["parameters"]["properties"] = _openai_types(item["parameters"]["properties"])
    return {"type": "function", "function": item}


def _openai_types(properties: dict[str, Any]) -> dict[str, Any]:
    """BFCL's `_cast_to_openai_type`: the types of `properties` (in place), recursively."""
    mapping = bfcl("constants.type_mappings").GORILLA_TO_OPENAPI
    for value in properties.values():
        kind = value.get("type")
        if kind is None:
            value["type"] = "string"
        else:
            if kind == "float":
                value["format"] = "float"
                value["description"] += " This is a float type value."
            value["type"] = mapping.get(kind, "string")
        if value["type"] not in ("array", "object"):
            continue
        if "properties" in value:
            value["properties"] = _openai_types(value["properties"])
        elif "items" in value:
            items = value["items"]
            items["type"] = mapping[items["type"]]
            if items["type"] == "array" and "items" in items:
                items["items"]["type"] = mapping[items["items"]["type"]]
            elif items["type"] == "object" and "properties" in items:
                items["properties"] = _openai_types(items["properties"])
    return properties
