"""A training run: the loop, its set-up, the SFT warm-up, checkpoints and resume, logs,
health checks, signals, preflight checks and `doctor`. May import everything above it.
"""
