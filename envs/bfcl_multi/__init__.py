"""BFCL v4 multi-turn as an environment (`agentgym/BFCLMultiTurn-v0`): see `env`."""
