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
