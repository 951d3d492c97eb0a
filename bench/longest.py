"""The longest functions of the packages named (statements, docstring left out), the way
tests/test_structure.py measures them: `python bench/longest.py agentgym/run agentgym/learn`."""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def longest(folder: Path, top: int = 3) -> list[tuple[int, str]]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                body = node.body[1:] if ast.get_docstring(node) is not None else node.body
                if body:
                    size = body[-1].end_lineno - body[0].lineno + 1
                    found.append((size, f"{path}:{node.lineno} {node.name}"))
    return sorted(found, reverse=True)[:top]


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        for size, where in longest(Path(arg)):
            print(f"{size:3d} lines  {where}")
