"""Verifiable rewards (math answers, formats) checked by code, users' reward functions run
in a worker process, and the `score` stage that adds them up with the length penalty.
What it may import: docs/overview.md#layout.
"""
