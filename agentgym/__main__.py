"""`python -m agentgym ...`: the `agentgym` command, as `torchrun -m agentgym train ...` runs it."""

from agentgym.cli import run

if __name__ == "__main__":
    run()
