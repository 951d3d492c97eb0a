"""The program that runs inside the sandbox: it calls a candidate, or records or replays tests.

Standard library only: the sandbox runs it as a script, with its job in
`job.json` in the working directory. Three modes (see `harness.py` for why):

- `candidate` (untrusted code in the process): executes the problem's prelude
  and then the model's code, calls the entry point on each encoded argument
  list, and writes one tagged JSON line per call, `<nonce> {"call": i,
  "value": ...}` or `... "error": ...`, on a private copy of stdout; the
  candidate's own stdout is sent to stderr. Events `ready` (the code imported),
  `done`, `syntax_error` and `import_error` frame the calls. The code runs as
  module `solution`, so its `if __name__ == "__main__":` demos do not run.
- `record` (trusted code only): runs a HumanEval `check` statement by
  statement against the canonical solution behind a proxy that records every
  call's arguments and result; prints them with each statement's call range.
- `replay` (trusted code only): runs the same statements against a proxy that
  answers each recorded call with the candidate's recorded output, and prints
  which test statements passed.

Values cross process boundaries in a tagged JSON encoding that admits only
exact builtin types (`type(x) is int`, not a subclass), so nothing the
candidate defines (an `__eq__` that always holds, a lying `__class__`) leaves
its process.
"""

from __future__ import annotations

import ast
import builtins
import json
import math
import os
import random
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: the sandbox starts this script
    from typing import Any

MAX_DEPTH = 64
_SCALARS = (type(None), bool, int, str)


class Unencodable(TypeError):
    """A value that is not plain builtin data (or is nested too deeply)."""


def encode(value, depth=0):
    """Plain builtin data as JSON-able data; tuples, sets, dicts, bytes, complex and
    non-finite floats are tagged with one-key objects. Raises Unencodable."""
    kind = type(value)
    if depth > MAX_DEPTH:
        raise Unencodable(f"nested deeper than {MAX_DEPTH}")
    if kind in _SCALARS:
        return value
    if kind is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind in (tuple, set, frozenset):
        items = [encode(v, depth + 1) for v in value]
        return {kind.__name__: items}
    if kind is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is complex:
        return {"complex": [encode(value.real, depth + 1), encode(value.imag, depth + 1)]}
    raise Unencodable(f"a {kind.__name__} is not plain builtin data")


_DECODERS = {
    "tuple": lambda items, d: tuple(decode(v, d) for v in items),
    "set": lambda items, d: {decode(v, d) for v in items},
    "frozenset": lambda items, d: frozenset(decode(v, d) for v in items),
    "dict": lambda pairs, d: {decode(k, d): decode(v, d) for k, v in pairs},
    "bytes": lambda text, d: bytes.fromhex(text),
    "complex": lambda parts, d: complex(decode(parts[0], d), decode(parts[1], d)),
    "float": lambda text, d: float(text),
}


def decode(data, depth=0):
    """The value `encode` encoded; raises ValueError/TypeError/KeyError on anything else."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH}")
    kind = type(data)
    if kind in _SCALARS or kind is float:
        return data
    if kind is list:
        return [decode(v, depth + 1) for v in data]
    if kind is dict and len(data) == 1:
        ((tag, payload),) = data.items()
        return _DECODERS[tag](payload, depth + 1)
    raise ValueError(f"not an encoded value: {type(data).__name__}")


def describe(err):
    """`Type: message` of an exception, even one whose `__str__` raises."""
    try:
        return f"{type(err).__name__}: {err}"[:500]
    except BaseException:
        return type(err).__name__


# -- candidate mode (untrusted code in this process) -------------------------


def run_candidate(job):
    nonce = sys.stdin.readline().strip()
    write, dumps, channel = os.write, json.dumps, os.dup(1)
    sys.stdout.flush()
    os.dup2(2, 1)  # the candidate's prints go to stderr, never to the results channel

    def emit(record):
        try:
            line = dumps(record)
        except (ValueError, TypeError, RecursionError) as err:  # e.g. an int of 5000 digits
            line = dumps({"call": record.get("call"), "error": describe(err)})
        write(channel, f"{nonce} {line}\n".encode())

    namespace = {"__name__": "solution", "__builtins__": builtins}
    exec(compile(job["prelude"], "prelude.py", "exec"), namespace)
    try:
        code = compile(job["source"], "solution.py", "exec")
    except (SyntaxError, ValueError) as err:  # ValueError: null bytes in the source
        emit({"event": "syntax_error", "error": describe(err)})
        os._exit(1)
    try:
        exec(code, namespace)
    except BaseException as err:  # SystemExit too: exiting while importing is a crash
        emit({"event": "import_error", "error": describe(err)})
        os._exit(1)
    emit({"event": "ready"})
    function: Any = namespace.get(job["entry_point"])  # None if missing: each call then fails
    for index, call in enumerate(job["calls"]):
        try:
            args, kwargs = decode(call)
            record = {"call": index, "value": encode(function(*args, **kwargs))}
        except BaseException as err:
            record = {"call": index, "error": describe(err)}
        emit(record)
    emit({"event": "done"})
    os._exit(0)  # skip atexit hooks and finalizers the candidate may have planted


# -- record and replay modes (trusted code only) -----------------------------


def test_statements(test_source):
    """The statements of `check`'s body, each with whether it is a test: it asserts and
    calls `candidate`. Others (`rng = ...`, `assert True`) are setup."""
    tree = ast.parse(test_source)
    (check,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    out = []
    for stmt in check.body:
        nodes = list(ast.walk(stmt))
        asserts = any(isinstance(n, ast.Assert) for n in nodes)
        calls = any(isinstance(n, ast.Name) and n.id == "candidate" for n in nodes)
        out.append((ast.Module(body=[stmt], type_ignores=[]), asserts and calls))
    return out


class _Mismatch(Exception):
    """The replayed check called the candidate differently than the recorded check."""


def _run_statements(job, candidate):
    """Runs `check`'s statements in order; yields (index, is_test, exception or None)."""
    namespace = {"__name__": "check"}
    exec(compile(job["prelude"], "prelude.py", "exec"), namespace)
    exec(compile(job["test"], "test.py", "exec"), namespace)
    namespace["candidate"] = candidate
    for index, (module, is_test) in enumerate(test_statements(job["test"])):
        random.seed(index)  # unseeded checks draw the same inputs in both runs
        candidate.start(index)
        try:
            exec(compile(module, "check.py", "exec"), namespace)
            yield index, is_test, None
        except Exception as err:
            yield index, is_test, err


class _Recorder:
    def __init__(self, function):
        self.function, self.calls, self.outputs, self.ranges = function, [], [], []

    def start(self, index):
        self.ranges.append([len(self.calls), len(self.calls)])

    def __call__(self, *args, **kwargs):
        self.calls.append(encode([list(args), kwargs]))
        result = self.function(*args, **kwargs)
        self.outputs.append(encode(result))
        self.ranges[-1][1] = len(self.calls)
        return decode(self.outputs[-1])


class _Replayer:
    def __init__(self, calls, ranges, outputs):
        self.calls, self.ranges, self.outputs, self.next = calls, ranges, outputs, 0

    def start(self, index):
        self.next, self.end = self.ranges[index]

    def __call__(self, *args, **kwargs):
        index, self.next = self.next, self.next + 1
        if index >= self.end or encode([list(args), kwargs]) != self.calls[index]:
            raise _Mismatch(f"call {index} differs from the recorded check")
        if self.outputs[index] is None:  # the call raised, or its result is not plain data
            raise _Mismatch(f"call {index} failed in the candidate's run")
        return decode(self.outputs[index]["value"])


def record(job):
    namespace = {"__name__": "reference"}
    exec(compile(job["prelude"], "prelude.py", "exec"), namespace)
    recorder = _Recorder(namespace[job["entry_point"]])
    results = list(_run_statements(job, recorder))
    failing = [f"{i}: {describe(e)}" for i, _, e in results if e is not None]
    return {
        "tests": [is_test for _, is_test, _ in results],
        "failing": failing,
        "calls": recorder.calls,
        "outputs": recorder.outputs,
        "ranges": recorder.ranges,
    }


def replay(job):
    replayer = _Replayer(job["calls"], job["ranges"], job["outputs"])
    results = list(_run_statements(job, replayer))
    return {"passed": [e is None for _, is_test, e in results if is_test]}


def main():
    with open("job.json", encoding="utf-8") as f:
        job = json.load(f)
    if job["mode"] == "candidate":
        run_candidate(job)
    sys.setrecursionlimit(10_000)
    result = record(job) if job["mode"] == "record" else replay(job)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
