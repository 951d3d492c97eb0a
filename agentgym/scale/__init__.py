"""Scaling out: Ray rollout workers (the samplers that play elsewhere), and rank 0's lead
of torch.distributed learners with FSDP's whole copy (`ranks`). What it may import:
docs/overview.md#layout.
"""
