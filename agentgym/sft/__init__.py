"""Supervised fine-tuning on each environment's own demonstrations (`warmup`): the
demonstrations, played through the real rollout; the SFT loss, step and optimizer (RFT
fine-tunes with them too); the warm-up that runs them; and `sft.long`'s config. The run
calls it before GRPO and for the closing table's `sft-long` row, and `agentgym sft` runs it
alone (`agentgym.run.phases.sft`). What it may import: docs/overview.md#layout.
"""
