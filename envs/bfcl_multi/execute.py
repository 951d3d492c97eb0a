"""The bridge to BFCL's own executor and multi-turn checker.

Calls run where BFCL runs them: `multi_turn_utils.execute_multi_turn_func_call` makes the
entry's API class instances from its `initial_config` on the first call and keeps them, in
that module's globals, under a name made of a "model name" and the entry's id; each call is
a string (`cd(folder='document')`) it evaluates against them, and each result is the text
BFCL gives the model (a dict as JSON, an exception as "Error during execution: ..."). An
episode is one such model name (`Session`), unique in the process, so episodes never share
instances; its instances are dropped from those globals when it ends (BFCL, which plays
each entry once per process, never drops them).

The verdict is `multi_turn_checker.multi_turn_checker` itself: it replays the model's calls,
turn by turn, on fresh instances beside the ground truth's and compares the instances' state
and the results after each turn. Around it, what BFCL's `eval_runner` does before calling it
(`_evaluate_single_multi_turn_entry`, whose module imports vendor SDKs): an episode with
fewer turns than the ground truth fails as "multi_turn:force_terminated", and steps without
a call are left out.

Only calls the env has checked reach BFCL's `eval`: a function the entry offers at that
turn, keyword arguments whose names are Python identifiers, values as JSON gives them
(their `repr` is a Python literal). A call BFCL would also have evaluated but this env does
not run (an unknown function name) is answered with an error and left out of the
verdict's calls: BFCL's `eval` of it would find no instance method (a NameError, or a
builtin of that name), which changes no instance, and its error text is not among the
ground truth's results, so the verdict is the same.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import keyword
from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.envs.bfcl_multi.data import BfclEntry, bfcl
from agentgym.types import ToolCall

_SERIAL = itertools.count()


def call_string(name: str, arguments: Mapping[str, Any]) -> str:
    """A call as BFCL's `convert_to_function_call` writes a function-calling model's call."""
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


def argument_problem(arguments: Mapping[str, Any]) -> str | None:
    """What keeps `arguments` from being written as keyword arguments; None if nothing."""
    for key in arguments:
        if not isinstance(key, str) or not key.isidentifier() or keyword.iskeyword(key):
            return f"argument name {key!r} is not a Python identifier"
    return None


def is_long_context(category: str) -> bool:
    """Whether BFCL loads the entry's scenario with its long context (as its handlers do)."""
    return "long_context" in category or "composite" in category


def fresh_name() -> str:
    """A model name no other episode or verdict in this process uses."""
    return f"agentgym_bfcl_{next(_SERIAL)}"


def forget(name: str) -> None:
    """Drops the instances BFCL's executor keeps for model name `name` (and the names the
    checker derives from it: `name_eval`, `name_ground_truth_eval`)."""
    namespace = vars(bfcl("eval_checker.multi_turn_eval.multi_turn_utils"))
    for key in tuple(namespace):
        if key.startswith(f"{name}_"):
            namespace.pop(key, None)


class Session:
    """One episode's instances of an entry's API classes, kept by BFCL's executor."""

    def __init__(self, entry: BfclEntry):
        self.entry = entry
        self.name = fresh_name()

    def execute(self, calls: Sequence[str]) -> list[str]:
        """BFCL's results of `calls`, run in order on this episode's instances."""
        utils = bfcl("eval_checker.multi_turn_eval.multi_turn_utils")
        results, _ = utils.execute_multi_turn_func_call(
            list(calls),
            self.entry.entry["initial_config"],
            list(self.entry.classes),
            self.name,
            self.entry.task_id,
            long_context=is_long_context(self.entry.category),
            is_evaL_run=False,
        )
        return list(results)

    def close(self) -> None:
        forget(self.name)


def verdict(entry: BfclEntry, turns: Sequence[Sequence[Sequence[str]]]) -> dict[str, Any]:
    """BFCL's verdict on an episode: `turns` holds, per user turn, the calls of each step.

    Returns {"valid": bool, "error_type": str | None, "error_message": str | None}.
    """
    if len(turns) != len(entry.ground_truth):
        return {
            "valid": False,
            "error_type": "multi_turn:force_terminated",
            "error_message": f"the episode played {len(turns)} of {len(entry.ground_truth)} turns",
        }
    checker = bfcl("eval_checker.multi_turn_eval.multi_turn_checker")
    decoded = [[list(step) for step in turn if step] for turn in turns]
    name = fresh_name()
    try:
        result = checker.multi_turn_checker(
            decoded,
            [list(turn) for turn in entry.ground_truth],
            dict(entry.entry),
            entry.category,
            name,
        )
    finally:
        forget(name)
    return {
        "valid": bool(result["valid"]),
        "error_type": result.get("error_type"),
        "error_message": result.get("error_message"),
    }


def _method(entry: BfclEntry, name: str) -> Any:
    """The method BFCL's executor binds `name` to: the last involved class that has it."""
    config = bfcl("constants.executable_backend_config")
    found = None
    for class_name in entry.classes:
        module = bfcl(config.CLASS_FILE_PATH_MAPPING[class_name].removeprefix("bfcl_eval."))
        method = getattr(getattr(module, class_name), name, None)
        if method is not None and not name.startswith("_"):
            found = method
    if found is None:
        raise ValueError(f"{entry.task_id}: ground truth calls {name!r}, no class of it has it")
    return found


def parse_call(entry: BfclEntry, text: str) -> ToolCall:
    """A ground-truth call string as a ToolCall, positional arguments named by the method's
    signature; ValueError naming the entry where it is not a call of literals."""
    node = ast.parse(text, mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"{entry.task_id}: ground truth {text!r} is not a function call")
    name = node.func.id
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    if args:
        bound = inspect.signature(_method(entry, name)).bind(None, *args, **kwargs)
        kwargs = {k: v for k, v in bound.arguments.items() if k != "self"}
    return ToolCall(name, kwargs)


def ground_truth_calls(entry: BfclEntry) -> tuple[tuple[ToolCall, ...], ...]:
    """The ground truth's calls, per turn."""
    return tuple(tuple(parse_call(entry, text) for text in turn) for turn in entry.ground_truth)
