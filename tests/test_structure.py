"""The shape of the code, kept: stage packages that import only downwards, no cycles, no
private names across modules, short files and functions, a short README.

The rule is the layout table of docs/overview.md, read from there: a package may import
the packages its row names, and what those may import. `agentgym/cli.py`, the package's
`__init__` and the thin re-exports users import (`agentgym.tool_env`) may import anything.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SOURCES = {"agentgym": ROOT / "agentgym", "agentgym.envs": ROOT / "envs",
           "agentgym.sandboxes": ROOT / "sandboxes"}  # fmt: skip
LAYOUT = ROOT / "docs" / "overview.md"


def _may_import() -> dict[str, set[str]]:
    """The layout table of docs/overview.md: each row's packages -> what they may import
    ("nothing": none; "anything": the top, which is every row's first name here "top")."""
    text = LAYOUT.read_text().split("## Layout", 1)[1]
    table: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        names, allowed = re.findall(r"`([a-z_.]+)`", cells[0]), cells[2]
        if allowed == "anything":
            table["top"] = set()
            continue
        for name in names:
            table[name] = set(re.findall(r"`([a-z_]+)`", allowed))
    return table


MAY_IMPORT = _may_import()
MAX_FILE_LINES, MAX_FUNCTION_LINES, MAX_README_BYTES = 450, 60, 12 * 1024
LOOP, MAX_LOOP_LINES = ROOT / "agentgym" / "run" / "train.py", 250


def _modules() -> dict[str, Path]:
    found = {}
    for prefix, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([prefix, *parts])] = path
    return found


MODULES = _modules()


def _layer(module: str) -> str:
    parts = module.split(".")
    if module.startswith(("agentgym.envs", "agentgym.sandboxes")):
        return parts[1]
    if len(parts) > 1 and parts[1] in MAY_IMPORT:
        return parts[1]
    return "top"


def _allowed(layer: str) -> set[str]:
    """`layer`, what its row names, and what those may import, and so on down."""
    seen, todo = {layer}, [layer]
    while todo:
        for below in MAY_IMPORT[todo.pop()] - seen:
            seen.add(below)
            todo.append(below)
    return seen | ({"types", "records"} if layer != "top" else set(MAY_IMPORT))


def _imports(module: str) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) of every agentgym import in `module`,
    at any depth (inside functions and `if TYPE_CHECKING:` too)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [
                (a.name, "", node.lineno) for a in node.names if a.name.startswith("agentgym")
            ]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            if not base.startswith("agentgym"):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub, "", node.lineno) if sub in MODULES
                             else (base, alias.name, node.lineno))  # fmt: skip
    return found


def _graph() -> dict[str, set[str]]:
    return {m: {t for t, _, _ in _imports(m) if t in MODULES and t != m} for m in MODULES}


def test_no_import_cycles():
    graph, cycles = _graph(), []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            if component:
                cycles.append(sorted([node, *component]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert cycles == []


def test_no_private_name_is_imported_from_another_module():
    bad = []
    for module in MODULES:
        for target, name, line in _imports(module):
            private_module = any(p.startswith("_") for p in target.split(".")[1:])
            same_package = target.rsplit(".", 1)[0] == module.rsplit(".", 1)[0]
            if target != module and name.startswith("_") and not name.startswith("__"):
                bad.append(f"{MODULES[module].relative_to(ROOT)}:{line} {target}.{name}")
            elif private_module and not same_package:
                bad.append(f"{MODULES[module].relative_to(ROOT)}:{line} {target}")
    assert bad == []


def test_each_package_imports_only_what_its_row_allows():
    bad = []
    for module in MODULES:
        layer, allowed = _layer(module), _allowed(_layer(module))
        for target, _, line in _imports(module):
            if target == "agentgym" and layer != "top":
                bad.append(f"{MODULES[module].relative_to(ROOT)}:{line} imports the package")
            elif _layer(target) not in allowed:
                where = MODULES[module].relative_to(ROOT)
                bad.append(f"{where}:{line} ({layer}) imports {target} ({_layer(target)})")
    assert bad == []


SHIMS = {
    "agentgym.tool_env": "re-exports agentgym.env.tool_env: `from agentgym.tool_env import ...`",
}
"""Thin re-exports kept for documented import paths: the only modules that may share a
name with a module of another package."""


def test_no_two_modules_share_a_name():
    """Across packages, a module's name says which one it is. The built-in environments'
    folders (`envs/<name>/`) are the exception by design: each has the same shape, an
    `env.py` and its `tasks.py`, as a user's own environment package would."""
    by_name: dict[str, list[str]] = {}
    for module in MODULES:
        plugin = module.startswith("agentgym.envs.") and module.count(".") >= 3
        if module not in SHIMS and module not in SOURCES and not plugin:
            by_name.setdefault(module.rsplit(".", 1)[1], []).append(module)
    assert {name: found for name, found in by_name.items() if len(found) > 1} == {}


def test_every_package_has_a_row_in_the_layout_table():
    packages = {_layer(m) for m in MODULES}
    folders = {p.name for p in (ROOT / "agentgym").iterdir() if (p / "__init__.py").is_file()}
    assert packages - {"top"} <= MAY_IMPORT.keys() and folders <= MAY_IMPORT.keys()


def test_files_and_functions_are_short():
    long_files, long_functions = [], []
    for path in sorted((ROOT / "agentgym").rglob("*.py")):
        source = path.read_text()
        if (lines := len(source.splitlines())) > MAX_FILE_LINES:
            long_files.append(f"{path.relative_to(ROOT)}: {lines}")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                body = node.body[1:] if ast.get_docstring(node) is not None else node.body
                if body and (size := body[-1].end_lineno - body[0].lineno + 1) > MAX_FUNCTION_LINES:
                    long_functions.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {size}"
                    )
    assert long_files == [] and long_functions == []


def test_the_formatter_is_not_turned_off():
    """`# fmt: skip` packed calls past the formatter; only a table of numbers may need it
    (none does today)."""
    skips = [f"{path.relative_to(ROOT)}:{i}" for folder in SOURCES.values()
             for path in sorted(folder.rglob("*.py"))
             for i, line in enumerate(path.read_text().splitlines(), 1)
             if "# fmt: skip" in line]  # fmt: skip
    assert skips == []


def test_the_training_loop_reads_in_one_sitting():
    assert len(LOOP.read_text().splitlines()) <= MAX_LOOP_LINES


def test_the_readme_is_short():
    assert (ROOT / "README.md").stat().st_size <= MAX_README_BYTES


@pytest.mark.parametrize(
    "statement",
    [
        "from agentgym import AgentEnv, Task, Feedback",
        "from agentgym.tools import tool",
        "from agentgym.tool_env import ToolEnv, ExpectedCall",
        "from agentgym.sandboxes import make_sandbox",
    ],
)
def test_the_imports_users_write_keep_working(statement):
    exec(statement, {})


def test_every_package_folder_goes_into_the_wheel():
    """pyproject.toml lists the packages (setuptools finds none on its own): a folder left
    out installs in editable mode and is missing from the wheel."""
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    roots = {
        "agentgym": ROOT / "agentgym",
        "agentgym.envs": ROOT / "envs",
        "agentgym.sandboxes": ROOT / "sandboxes",
    }
    found = {
        ".".join((name, *init.parent.relative_to(folder).parts))
        for name, folder in roots.items()
        for init in folder.rglob("__init__.py")
    }
    assert found - listed == set()
