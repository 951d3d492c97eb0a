"""Writes `tests/fixtures/harbor_task_schema.json` from a harbor wheel's task config models.

harbor needs Python 3.12 and cannot be imported here (3.11), so its models are read as
source: for each pydantic model in `harbor/models/task/config.py`, its fields (own and
inherited) with their annotations as written, and each `str` Enum's values. The JSON is
checked in; `tests/test_harbor_schema.py` compares agentgym's task.toml reader with it.

    pip download harbor==0.25.0 --no-deps --python-version 3.12 --only-binary=:all: -d /tmp/h
    python tests/harbor_schema_extract.py /tmp/h/harbor-0.25.0-py3-none-any.whl
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import zipfile
from pathlib import Path

MODULE = "harbor/models/task/config.py"
OUT = Path(__file__).parent / "fixtures" / "harbor_task_schema.json"


def extract(source: str) -> tuple[dict[str, dict[str, str]], dict[str, list[str]]]:
    """({model: {field: annotation}}, {enum: [values]}) of a config module's source."""
    tree = ast.parse(source)
    own: dict[str, dict[str, str]] = {}
    bases: dict[str, list[str]] = {}
    enums: dict[str, list[str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        names = [ast.unparse(b) for b in node.bases]
        if "Enum" in names:
            enums[node.name] = [
                stmt.value.value
                for stmt in node.body
                if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)
            ]
            continue
        bases[node.name] = names
        own[node.name] = {
            stmt.target.id: ast.unparse(stmt.annotation)
            for stmt in node.body
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
        }

    def fields(name: str) -> dict[str, str]:
        inherited: dict[str, str] = {}
        for base in bases.get(name, []):
            if base in own:
                inherited.update(fields(base))
        return {**inherited, **own[name]}

    models = {name: fields(name) for name in own if "BaseModel" in _ancestry(name, bases)}
    return models, enums


def _ancestry(name: str, bases: dict[str, list[str]]) -> set[str]:
    seen: set[str] = set()
    todo = [name]
    while todo:
        for base in bases.get(todo.pop(), []):
            if base not in seen:
                seen.add(base)
                todo.append(base)
    return seen


def main(wheel: str) -> None:
    with zipfile.ZipFile(wheel) as archive:
        source = archive.read(MODULE)
    models, enums = extract(source.decode())
    data = {
        "source": f"{Path(wheel).name}:{MODULE}",
        "sha256": hashlib.sha256(source).hexdigest(),
        "made_by": "tests/harbor_schema_extract.py",
        "models": models,
        "enums": enums,
    }
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
