"""`python -m agentgym ...`: the `agentgym` command, as `torchrun -m agentgym train ...` runs it."""

import sys

from agentgym.cli import main

if __name__ == "__main__":
    sys.exit(main())
