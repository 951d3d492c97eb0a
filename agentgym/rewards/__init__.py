"""Verifiable rewards (math answers, formats) checked by code, and users' reward
functions run in a worker process. May import: types, config, text.
"""
