"""A verifiers 0.4.0 environment package, written for agentgym's tests: sums of two
numbers, with their answers, a weighted reward that reads the agent's last reply, and a
metric. Nothing downloaded; `verifiers.v1` loads it as the taskset `vf-sums`."""

from __future__ import annotations

import re

import verifiers.v1 as vf


class SumData(vf.TaskData):
    """One sum and its answer."""

    answer: int


class SumTask(vf.Task[SumData]):
    """The reward: the answer among the last reply's numbers; a metric: its length."""

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        numbers = re.findall(r"-?\d+", trace.last_reply)
        return 1.0 if str(self.data.answer) in numbers else 0.0

    @vf.reward(weight=0.5)
    async def brief(self, trace: vf.Trace) -> float:
        return 1.0 if len(trace.last_reply) <= 40 else 0.0

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class SumsConfig(vf.TasksetConfig):
    num_tasks: int = 12
    """How many sums."""
    largest: int = 20
    """The largest addend."""


class SumsTaskset(vf.Taskset[SumTask, SumsConfig]):
    def load(self) -> list[SumTask]:
        tasks = []
        for i in range(self.config.num_tasks):
            a, b = (7 * i + 3) % (self.config.largest + 1), (5 * i + 1) % (self.config.largest + 1)
            data = SumData(
                id=f"sum-{i}",
                prompt=f"What is {a} + {b}? Reply with the number.",
                system_prompt="You add numbers.",
                answer=a + b,
            )
            tasks.append(SumTask(data, self.config.task))
        return tasks


__all__ = ["SumsTaskset"]
