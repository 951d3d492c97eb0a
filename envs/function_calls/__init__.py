"""`agentgym/FunctionCalls-v0`: a procedural function-calling world (see `env`)."""
