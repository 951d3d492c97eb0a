"""The public API: `agentgym.__all__` as docs/api.md lists it, every name the docs import, and
the paths earlier docs gave, which still import with a DeprecationWarning naming the new one."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import agentgym
from agentgym.moved import MOVED

ROOT = Path(__file__).resolve().parent.parent


def _documented_names() -> set[str]:
    rows = [
        line
        for line in (ROOT / "docs" / "api.md").read_text().splitlines()
        if line.startswith("| `")
    ]
    return {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}


def test_all_is_what_docs_api_lists_and_each_name_imports():
    assert set(agentgym.__all__) == _documented_names()
    assert len(agentgym.__all__) == len(set(agentgym.__all__))
    for name in agentgym.__all__:
        assert getattr(agentgym, name) is not None, name
    assert set(agentgym.__all__) <= set(dir(agentgym))
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        agentgym.nonsense  # noqa: B018


def test_each_lazy_name_is_its_modules_own_object():
    from agentgym.cli import main
    from agentgym.env.checker import check_agent_env
    from agentgym.tools import tool

    assert (agentgym.main, agentgym.check_agent_env, agentgym.tool) == (main, check_agent_env, tool)


def test_importing_the_package_leaves_the_heavy_modules_unloaded():
    code = (
        "import sys, agentgym; "
        "print(sorted(m for m in ('transformers', 'agentgym.serve', 'agentgym.learn', "
        "'agentgym.run', 'agentgym.cli') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _doc_imports() -> list[str]:
    files = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *(ROOT / "docs").glob("*.py"),
    ]
    found = {
        m.group(0)
        for f in files
        for m in re.finditer(r"^\s*from agentgym[\w.]* import [\w, ]+$", f.read_text(), re.M)
    }
    return sorted(line.strip() for line in found)


@pytest.mark.parametrize("line", _doc_imports())
def test_every_import_the_docs_give_works_and_is_not_a_moved_path(line):
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".* has moved", category=DeprecationWarning)
        exec(line, {})


def test_the_docs_import_something():
    assert len(_doc_imports()) >= 5  # the scan above reads the docs' code


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_moved_path_imports_with_a_warning_naming_the_new_one(old):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{re.escape(old)} has moved: import from") as seen:
        module = importlib.import_module(old)
    assert MOVED[old][0] in str(seen[0].message)
    assert seen[0].filename == __file__  # the warning points at the importing line
    new = importlib.import_module(MOVED[old][0])
    public = [n for n in dir(new) if not n.startswith("_")]
    assert public and getattr(module, public[0]) is getattr(new, public[0])
    with pytest.raises(AttributeError, match=f"{re.escape(old)}.*no attribute 'nonsense'"):
        module.nonsense  # noqa: B018


def test_names_earlier_docs_gave_are_the_same_objects_from_their_old_paths():
    from agentgym.env.checker import check_agent_env
    from agentgym.learn.losses import register_policy_loss

    sys.modules.pop("agentgym.checker", None), sys.modules.pop("agentgym.grpo", None)
    with pytest.warns(DeprecationWarning):
        from agentgym.checker import check_agent_env as old_check
    with pytest.warns(DeprecationWarning):
        from agentgym.grpo import register_policy_loss as old_register
    assert (old_check, old_register) == (check_agent_env, register_policy_loss)


def test_no_moved_path_shadows_a_module_that_exists():
    for old in MOVED:
        parent, _, leaf = old.rpartition(".")
        path = importlib.import_module(parent).__path__
        assert importlib.machinery.PathFinder.find_spec(old, path) is None, old


def test_the_license_file_is_the_license_the_metadata_declares():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    text = (ROOT / "LICENSE").read_text()
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert (
        "END OF TERMS AND CONDITIONS" in text
        and "http://www.apache.org/licenses/LICENSE-2.0" in text
    )
