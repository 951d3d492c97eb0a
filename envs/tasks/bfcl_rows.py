"""BFCL v4's single-turn data as `agentgym/Tasks-v0` rows, row for row, from the bfcl-eval wheel.

    python -m agentgym.envs.tasks.bfcl_rows OUT.jsonl [--categories simple_python parallel ...]

writes one JSON line per row of `bfcl_eval/data/BFCL_v4_<category>.json`, in the
published order: "id" (BFCL's, e.g. `simple_python_12`), "category" (BFCL's category
name), "prompt" (the question's one turn of chat messages), "tools" (the function docs
as they are: BFCL's type names, which Tasks-v0 reads, see docs/tasks.md) and "calls"
(the possible answer from `data/possible_answer/`, `[]` in the irrelevance categories,
whose right answer is no call). Load the file with

    gymnasium.make("agentgym/Tasks-v0", data="OUT.jsonl", tools_column="tools",
                   expected_calls_column="calls", category_column="category",
                   string_match="bfcl")

which skips, by line and id with BFCL's reason, each row BFCL's own checker accepts no
call for (the command lists them too). `LEFT_OUT` says which categories are not
converted, and why.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from agentgym.extras import need
from agentgym.rewards.bfcl import CATEGORIES, unscorable
from agentgym.rewards.calls import call_specs
from agentgym.tools.schema import strict_schema

IRRELEVANCE: frozenset[str] = frozenset({"irrelevance", "live_irrelevance"})
LEFT_OUT: dict[str, str] = {
    "simple_java": "BFCL converts each argument, given as Java source text, to a value "
    "with its java_type_converter before comparing (Language.JAVA): a Java checker",
    "simple_javascript": "likewise with js_type_converter (Language.JAVASCRIPT)",
    "live_relevance": "no possible answer: BFCL counts any decoded call as right "
    "(relevance_file_runner), which expected calls cannot say",
    "format_sensitivity": "not scored by BFCL (NON_SCORING_CATEGORY)",
    "multi_turn_*": "several user turns against BFCL's stateful simulated APIs, checked by "
    "end state: another environment",
    "memory_*, web_search_*": "agentic: a memory backend or live web search",
}
"""Categories of the wheel not converted, each with why."""
PACKAGE = "bfcl-eval"


def bfcl_version() -> str:
    """The installed bfcl-eval's version (the data's and the checker's)."""
    need("bfcl_eval", "BFCL v4's data")
    return metadata.version(PACKAGE)


def _lines(path: Any) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def check_categories(categories: Sequence[str] | None) -> tuple[str, ...]:
    """The chosen categories (None: all of `CATEGORIES`); ValueError naming the unknown
    ones, and why a category `LEFT_OUT` is."""
    if categories is None:
        return CATEGORIES
    if isinstance(categories, str):
        categories = [categories]
    problems = []
    for name in categories:
        if name in CATEGORIES:
            continue
        why = LEFT_OUT.get(name) or next(
            (w for k, w in LEFT_OUT.items() if k.endswith("*") and name.startswith(k[:-1])), None
        )
        problems.append(f"{name!r} ({why})" if why else repr(name))
    if problems or not categories:
        raise ValueError(
            f"BFCL categories {', '.join(problems) or '[]'} are not supported; valid: "
            f"{', '.join(CATEGORIES)}"
        )
    return tuple(dict.fromkeys(categories))


def category_rows(category: str) -> list[dict[str, Any]]:
    """The rows of one category, as Tasks-v0 rows (see the module), in published order."""
    bfcl = need("bfcl_eval", f"BFCL v4's {category!r} rows")
    data = resources.files(bfcl) / "data"
    questions = list(_lines(data / f"BFCL_v4_{category}.json"))
    answers: dict[str, Any] = {}
    if category not in IRRELEVANCE:
        answers = {
            a["id"]: a["ground_truth"]
            for a in _lines(data / "possible_answer" / f"BFCL_v4_{category}.json")
        }
    rows = []
    for question in questions:
        turns = question["question"]
        if len(turns) != 1:
            raise ValueError(f"BFCL row {question['id']}: {len(turns)} turns; valid: one turn")
        rows.append(
            {
                "id": question["id"],
                "category": category,
                "prompt": turns[0],
                "tools": question["function"],
                "calls": answers[question["id"]] if answers else [],
            }
        )
    return rows


def bfcl_rows(categories: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Every row of the chosen categories (None: all of `CATEGORIES`), category by category."""
    return [row for category in check_categories(categories) for row in category_rows(category)]


def row_problem(row: Mapping[str, Any]) -> str | None:
    """Why BFCL's checker accepts no call for a row (None where it accepts its answer)."""
    parameters = {f["name"]: strict_schema(f.get("parameters", {})) for f in row["tools"]}
    return unscorable(call_specs(row["calls"]), parameters)


def main(argv: Sequence[str] | None = None) -> int:
    """Writes the rows to OUT.jsonl; prints the rows per category and the rows BFCL cannot score."""
    parser = argparse.ArgumentParser(
        prog="python -m agentgym.envs.tasks.bfcl_rows", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("out", type=Path, help="the .jsonl file to write")
    parser.add_argument(
        "--categories",
        nargs="+",
        default=None,
        help=f"BFCL categories (default: {' '.join(CATEGORIES)})",
    )
    args = parser.parse_args(argv)
    try:
        categories = check_categories(args.categories)
    except ValueError as err:
        parser.error(str(err))
    written = 0
    with args.out.open("w", encoding="utf-8") as out:
        for category in categories:
            rows = category_rows(category)
            skipped = [(row["id"], problem) for row in rows if (problem := row_problem(row))]
            for row in rows:
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
            written += len(rows)
            print(f"{category}: {len(rows)} rows, {len(rows) - len(skipped)} scorable")
            for ident, problem in skipped:
                print(f"  skipped by Tasks-v0 (string_match: bfcl): {ident}: {problem}")
    print(f"wrote {written} rows of bfcl-eval {bfcl_version()} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
