"""A training run: the loop (`train`), the `record` stage, the run's set-up, the stages
around GRPO (`phases`: the SFT warm-up among them, and `agentgym sft`), checkpoints and
resume, logs, health checks, signals and preflight checks. What it may import:
docs/overview.md#layout.
"""
