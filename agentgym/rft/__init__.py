"""`agentgym rft`: rejection-sampling fine-tuning, rounds of sampling with the current
policy, keeping the episodes the verifier passes and fine-tuning on them
(`rejection_sampling`; its docstring says which choices it makes). It runs on the run's
set-up, sampler and checkpoints and on the SFT step. What it may import:
docs/overview.md#layout.
"""
