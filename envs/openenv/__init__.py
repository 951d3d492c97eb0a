"""`agentgym/OpenEnv-v0`: any OpenEnv server, played over its WebSocket route."""
