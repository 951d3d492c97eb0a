"""Rollouts, the `collect` stage: the Sampler protocol, G episodes per task played against
an environment; the sampler makes the loss mask (the agent's own tokens only). What it may
import: docs/overview.md#layout.
"""
