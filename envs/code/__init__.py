"""Built-in code environment: HumanEval and generated tasks, run in a sandbox."""
