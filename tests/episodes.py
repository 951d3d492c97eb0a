"""Helpers shared by the environment tests."""

from __future__ import annotations


def play(env, turns):
    """Steps `env` through `turns`; returns the summed reward, summed parts, and the last step."""
    total, parts, last = 0.0, {}, None
    for turn in turns:
        last = env.step(turn)
        total += last[1]
        for key, value in last[4]["reward_parts"].items():
            parts[key] = parts.get(key, 0.0) + value
    return total, parts, last
