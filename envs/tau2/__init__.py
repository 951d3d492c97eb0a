"""`agentgym/Tau2-v0`: τ²-bench's customer-service tasks, offline, scored by τ²'s evaluator."""
