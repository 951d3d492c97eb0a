"""Harbor task folders as an agentgym environment (`agentgym/Harbor-v0`)."""
