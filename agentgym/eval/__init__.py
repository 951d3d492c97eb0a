"""Evaluation: held-out play and scoring, statistics (pass@k, intervals), reports, plots
and report tables. May import: rollout, env, policy.
"""
