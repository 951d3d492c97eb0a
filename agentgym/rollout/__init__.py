"""Rollouts: G episodes per task played against an environment; the sampler makes
the loss mask (the agent's own tokens only). May import: env, policy, types.
"""
