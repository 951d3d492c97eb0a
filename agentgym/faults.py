"""Deterministic fault points, so that tests stop a run where they mean to, not by timing.

`AGENTGYM_FAULT="<signal>@<point>:<step>"` sends this process SIGKILL (`kill`) or SIGTERM
(`term`) when the run reaches `<point>` of GRPO step `<step>`:

- `rollout`: the sampler begins playing the step's tasks (on the sampler's thread when
  the run samples ahead: then the learner is stepping on an earlier step meanwhile);
- `update`: the learner begins its update on the step's episodes;
- `step_end`: the step is recorded (metrics, trained.jsonl), before its checkpoint.

Unset (what every real run has), `reached` does nothing. A value that does not parse is
refused with what would be valid, at the first point the run reaches.
"""

from __future__ import annotations

import os
import re
import signal

VARIABLE = "AGENTGYM_FAULT"
POINTS = ("rollout", "update", "step_end")
SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM}
_SPEC = re.compile(r"(kill|term)@(rollout|update|step_end):([0-9]+)")


def reached(point: str, step: int) -> None:
    """Sends the configured signal when `AGENTGYM_FAULT` names `point` of `step`."""
    assert point in POINTS, point
    spec = os.environ.get(VARIABLE)
    if not spec:
        return
    match = _SPEC.fullmatch(spec.strip())
    if match is None:
        raise ValueError(
            f"{VARIABLE}={spec!r}: expected '<signal>@<point>:<step>' with signal kill or "
            f"term and point one of {', '.join(POINTS)} (e.g. 'kill@update:3')"
        )
    name, at, when = match.groups()
    if at == point and int(when) == step:
        os.kill(os.getpid(), SIGNALS[name])
