"""The reward a Harbor task's tests wrote, read as harbor 0.25.0 reads it.

`tests/test.sh` writes `/logs/verifier/reward.json` (an object of named numbers) or
`/logs/verifier/reward.txt` (one number); the JSON file wins where both exist. harbor's
verifier refuses an empty file, text that is not a number, a non-finite number and a
JSON value that is not a number; each named number is a reward. Its one figure per trial
(the "primary reward" its job summaries and uploads report) is the key `reward`, else the
only key, else none: agentgym pays that figure as the episode reward and logs every named
number as a reward part. Where harbor has no figure (no file, a file it refuses, several
keys without `reward`), the episode's reward is 0 and `Verdict.reason` says why: the
task's fault, never a crash of the run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

REWARD_JSON = "/logs/verifier/reward.json"
REWARD_TXT = "/logs/verifier/reward.txt"


@dataclass(frozen=True)
class Verdict:
    """What the tests said: the episode reward, the named rewards, and why it is 0 if the
    file could not give one."""

    reward: float
    parts: Mapping[str, float] = field(default_factory=dict)
    reason: str | None = None


def _number(value: object) -> float | None:
    """The value as a finite float, if it is a JSON number (harbor counts true as 1)."""
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def read_reward(json_text: str | None, txt_text: str | None) -> Verdict:
    """The verdict of the reward files' contents (None: the file does not exist)."""
    if json_text is not None:
        return _from_json(json_text)
    if txt_text is not None:
        if not txt_text.strip():
            return Verdict(0.0, reason=f"{REWARD_TXT} is empty")
        try:
            value = _number(float(txt_text))
        except ValueError:
            value = None
        if value is None:
            return Verdict(0.0, reason=f"{REWARD_TXT} holds {txt_text[:80]!r}, not a number")
        return Verdict(value, {"reward": value})
    return Verdict(0.0, reason=f"the tests wrote neither {REWARD_TXT} nor {REWARD_JSON}")


def _from_json(text: str) -> Verdict:
    if not text.strip():
        return Verdict(0.0, reason=f"{REWARD_JSON} is empty")
    try:
        data = json.loads(text)
    except ValueError as err:
        return Verdict(0.0, reason=f"{REWARD_JSON} is not JSON: {err}")
    if not isinstance(data, dict) or not data:
        return Verdict(
            0.0, reason=f"{REWARD_JSON} holds {text[:80]!r}; valid: an object of numbers"
        )
    parts = {str(k): _number(v) for k, v in data.items()}
    bad = sorted(k for k, v in parts.items() if v is None)
    if bad:
        return Verdict(0.0, reason=f"{REWARD_JSON}: {', '.join(bad)} not finite numbers")
    named = {k: v for k, v in parts.items() if v is not None}
    if "reward" in named:
        return Verdict(named["reward"], named)
    if len(named) == 1:
        return Verdict(next(iter(named.values())), named)
    return Verdict(
        0.0,
        named,
        reason=f"{REWARD_JSON} has several rewards ({', '.join(sorted(named))}) and no "
        "'reward' key: harbor's primary reward is undefined",
    )
