"""`python -m agentgym.sandboxes.docker_setup`: starts a Docker engine if none answers and
builds the "docker" sandbox's image, by running the `docker_setup.sh` installed beside this
module (in a checkout, `bash sandboxes/docker_setup.sh` is the same script).

    python -m agentgym.sandboxes.docker_setup           # as root
    python -m agentgym.sandboxes.docker_setup --where   # print the script's path only
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("docker_setup.sh")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not SCRIPT.is_file():
        print(f"docker_setup: {SCRIPT} is missing: reinstall agentgym", file=sys.stderr)
        return 2
    if args == ["--where"]:
        print(SCRIPT)
        return 0
    if args:
        print("usage: python -m agentgym.sandboxes.docker_setup [--where]", file=sys.stderr)
        return 2
    return subprocess.call(["bash", str(SCRIPT)])


if __name__ == "__main__":
    sys.exit(main())
