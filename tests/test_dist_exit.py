"""How a torchrun rank ends when FSDP kept its process group alive (`dist.shutdown`,
`cli.run`): without the interpreter's teardown, where gloo's threads can abort it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_distributed_learner import run_on_two_ranks

HERE = Path(__file__).parent


@pytest.mark.parametrize(("mode", "outlived"), [("fsdp", "True"), ("plain", "False")])
def test_shutdown_tells_whether_fsdp_kept_the_group_alive(tmp_path, mode, outlived):
    run_on_two_ranks(str(HERE / "group_outlives.py"), mode, str(tmp_path))
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == [outlived] * 2


EXIT = """
import atexit, sys
from agentgym import cli
from agentgym.learn import dist
atexit.register(lambda: print("exit handler ran", flush=True))
class Teardown:  # its __del__ runs in the interpreter's teardown, and only there
    def __del__(self):
        print("teardown ran", flush=True)
sys.modules["__main__"].keep = Teardown()
dist._group_outlived = {outlived}
cli.main = lambda: 3
print("unflushed", end="")
cli.run()
"""


@pytest.mark.parametrize("outlived", [True, False])
def test_run_skips_the_teardown_only_when_the_group_outlived(outlived):
    done = subprocess.run([sys.executable, "-c", EXIT.format(outlived=outlived)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith("unflushed")  # flushed before os._exit
    assert "exit handler ran" in done.stdout
    assert ("teardown ran" in done.stdout) is not outlived
