"""Scaling out: Ray rollout workers, rank 0's lead of torch.distributed learners, FSDP
and weight synchronisation. May import: rollout, learn, policy.
"""
