"""`agentgym/Verifiers-v0`: a verifiers environment package trained on as an agentgym env."""
