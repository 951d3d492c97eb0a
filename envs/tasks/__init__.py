"""`agentgym/Tasks-v0`: tasks from your own data file (see `env.py`)."""
