"""Learning: the `advantages` stage (estimators registered by name, per-token values), the
losses (pure functions, registered by name), log-probs, the learner and the `update` stage,
and torch.distributed collectives of the learner. What it may import: docs/overview.md#layout.
"""
