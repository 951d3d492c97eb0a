"""The docker sandbox's setup script, checked where no engine runs as well."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from agentgym.sandboxes import docker as docker_sandbox

SCRIPT = Path(__file__).resolve().parents[1] / "sandboxes" / "docker_setup.sh"


def test_setup_script_builds_the_image_the_sandbox_runs() -> None:
    built = re.search(r'^IMAGE="([^"]+)"', SCRIPT.read_text(), re.MULTILINE)
    assert built is not None and built.group(1) == docker_sandbox.IMAGE


def test_setup_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_the_installed_package_runs_its_own_copy_of_the_script() -> None:
    """The sandbox's hint names a module that an installed wheel has (no checkout needed)."""
    import sys

    assert "python -m agentgym.sandboxes.docker_setup" in docker_sandbox.SETUP_HINT
    where = subprocess.run(
        [sys.executable, "-m", "agentgym.sandboxes.docker_setup", "--where"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert Path(where.stdout.strip()).read_text() == SCRIPT.read_text()
    wrong = subprocess.run(
        [sys.executable, "-m", "agentgym.sandboxes.docker_setup", "--nonsense"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert wrong.returncode == 2 and "usage:" in wrong.stderr
