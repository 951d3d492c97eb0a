"""Learning: group-relative advantages and losses (pure functions, registered by name),
log-probs, the optimizer step and torch.distributed collectives of the learner.
May import: types, config.
"""
