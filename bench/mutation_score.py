"""Mutation score of the core math, the loss mask and the tool-call parsers (`make mutate`).

Runs mutmut (configured in pyproject.toml's `[tool.mutmut]`) over one module at a
time, on one child process, and prints per module: mutants killed / total, and
the rest by kind. Only a killed mutant counts: "no tests", "timeout" and the
rarer kinds count as survivors, as does a mutant left unchecked.

Each module is scored over all its functions but those in `SKIP`, or over those
in `ONLY`: the functions the issue names and what they call. mutmut never
mutates decorated functions (`@torch.no_grad()`, `@contextmanager`), nor code at
module level. Each mutant runs only the selected tests (pyproject.toml) that
called its function in mutmut's stats run.

A mutant that makes a test hang (an endless loop) is killed by a deadline on
each test, not left to mutmut's timeout: mutmut loads this module into its
pytest runs as a plugin (`-p bench.mutation_score` in pyproject.toml), and a
test past `TEST_DEADLINE_S` ends its run with exit status 1, as pytest-timeout's
thread method does. Those kills are counted apart ("by deadline").

A module where not one mutant is killed stops the run with an error: it means
the tests did not import the mutated copy under mutants/ (see pyproject.toml).

    python bench/mutation_score.py                 # every module; run from the repo root
    python bench/mutation_score.py grpo evaluate   # some of them
    python bench/mutation_score.py --no-run --show # score what mutants/ holds, with diffs
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from mutmut.stats import status_by_exit_code

MODULES = {
    "evaluate": "eval.stats",
    "grpo": "learn.grpo",
    "losses": "learn.losses",
    "tool_formats": "tools.formats",
    "rollout": "rollout.episodes",
    "logprobs": "learn.logprobs",
    "learner": "learn.learner",
    "update": "learn.update",
    "tool_reward": "env.tool_env",
    "ahead": "rollout.ahead",
}
"""The modules scored, in the order they run (fastest first): short name, module under agentgym."""

ONLY = {
    "ahead": ["x_staleness", "x_stale_groups", "x_drop_stale"],  # async GRPO's staleness rule
    "learner": [  # Learner's loss and accumulation, and what they call here
        "xǁLearnerǁ_loss",
        "xǁLearnerǁaccumulate",
        "xǁLearnerǁ_weight",
        "x__to",
    ],
    "logprobs": [  # what the learner's loss and accumulation call there
        "x_backward_micro_batches",
        "x_token_logprobs",
        "x__head_logprobs",
        "x__hidden_states",
        "x_run_prefix",
        "x_shared_prefix_length",
        "x__softcap",
        "x__decoder_and_head",
    ],
    "rollout": ["x__start", "x__advance", "x_continuation_ids", "x_collect", "x__finish"],
    "tool_reward": [  # the tool environment's reward: the expected calls, matched and paid
        "x__normalised",
        "x_arguments_equal",
        "xǁExpectedCallǁmatches",
        "x_tool_reward",
        "xǁToolEnvǁ_parts",
        "xǁToolEnvǁ_pay",
    ],
}
"""Modules scored over some of their functions (mutmut's mangled names: x_f, xǁClassǁf)."""

SKIP = {
    "tool_formats": [  # not parsing: the prompt's prose, the results' wording, Protocol stubs
        "xǁHermesFormatǁinstructions",
        "xǁReactFormatǁinstructions",
        "xǁHermesFormatǁobservation",
        "xǁReactFormatǁobservation",
        "xǁToolCallFormatǁ*",
    ],
}
"""Functions left out of the other modules, which are scored over all the rest."""

COLUMNS = ("survived", "no tests", "timeout")
"""The kinds of survivor counted apart; "other" sums the rest (suspicious, segfault...)."""


def functions(module: str) -> list[str]:
    """The mangled names of `module`'s functions in scope, as mutmut names them."""
    if module in ONLY:
        return ONLY[module]
    tree = ast.parse(Path(f"agentgym/{MODULES[module].replace('.', '/')}.py").read_text())
    names = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            names.append(f"x_{node.name}")
        elif isinstance(node, ast.ClassDef):
            names += [
                f"xǁ{node.name}ǁ{f.name}" for f in node.body if isinstance(f, ast.FunctionDef)
            ]
    return [n for n in names if not any(fnmatch.fnmatchcase(n, s) for s in SKIP.get(module, []))]


def scope(module: str) -> list[str]:
    """`mutmut run` globs for the module's mutants in scope. `f*`, not `f__mutmut_*`: mutmut
    matches them against function names too, to pick the tests of its clean run."""
    return [f"agentgym.{MODULES[module]}.{name}*" for name in functions(module)]


def run_mutmut(module: str, log: Path) -> float:
    """Runs mutmut over `module`'s scope on one child; returns the seconds it took."""
    mutmut = Path(sys.executable).with_name("mutmut")
    # mutmut forks a worker per mutant from a process that has run torch: an OpenMP thread
    # pool there would hang the workers' first parallel op (seen as false timeouts)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.monotonic()
    with log.open("w") as out:
        command = [str(mutmut), "run", "--max-children", "1", *scope(module)]
        done = subprocess.run(command, stdout=out, stderr=out, env=env)
    if done.returncode != 0:
        sys.exit(f"mutmut failed on {module} (exit {done.returncode}); see {log}")
    return time.monotonic() - start


def statuses(module: str) -> dict[str, str]:
    """Each mutant of `module`'s scope and its status ("killed", "survived", "no tests"...)."""
    meta = Path("mutants/agentgym") / f"{MODULES[module].replace('.', '/')}.py.meta"
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    names = {f"agentgym.{MODULES[module]}.{name}" for name in functions(module)}
    return {
        name: status_by_exit_code[code]
        for name, code in sorted(codes.items())
        if name.partition("__mutmut_")[0] in names
    }


def by_deadline(found: dict[str, str]) -> int:
    """How many of the killed mutants in `found` the test deadline killed."""
    path = Path("mutants") / DEADLINE_KILLS
    hung = {line.split()[0] for line in path.read_text().splitlines()} if path.exists() else set()
    return sum(1 for name, status in found.items() if status == "killed" and name in hung)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help=f"some of {', '.join(MODULES)}; default all")
    parser.add_argument("--no-run", action="store_true", help="score what mutants/ holds")
    parser.add_argument("--show", action="store_true", help="print each survivor's diff")
    args = parser.parse_args()
    modules = args.modules or list(MODULES)
    if unknown := sorted(set(modules) - set(MODULES)):
        parser.error(f"unknown module(s) {', '.join(unknown)}; choose from {', '.join(MODULES)}")
    Path("mutants").mkdir(exist_ok=True)
    rows, survivors, empty = [], [], []
    for module in modules:
        seconds = None if args.no_run else run_mutmut(module, Path(f"mutants/{module}.log"))
        found = statuses(module)
        counts = Counter(found.values())
        if counts["killed"] == 0 and found:
            empty.append(module)
        survivors += [(name, status) for name, status in found.items() if status != "killed"]
        rows.append((module, len(found), counts, by_deadline(found), seconds))
        print(_row(*rows[-1]), flush=True)
    print(f"\n{HEADER}")
    for row in rows:
        print(_row(*row))
    print(f"\n{len(survivors)} surviving mutants (no tests and timeouts included):")
    for name, status in survivors:
        print(f"  {status:10} {name}")
        if args.show:
            shown = subprocess.run(
                [str(Path(sys.executable).with_name("mutmut")), "show", name],
                capture_output=True,
                text=True,
            )
            print("    " + shown.stdout.strip().replace("\n", "\n    "))
    if empty:
        sys.exit(f"no mutant killed in {', '.join(empty)}: the tests did not run the mutated copy")


HEADER = (
    "module        killed/total  score   by deadline  survived  no tests   timeout  other  seconds"
)


def _row(module: str, total: int, counts: Counter, hung: int, seconds: float | None) -> str:
    killed = counts["killed"]
    score = 100 * killed / total if total else 100.0
    other = sum(n for status, n in counts.items() if status not in ("killed", *COLUMNS))
    took = "-" if seconds is None else f"{seconds:.0f}"
    return (
        f"{module:13} {killed:>5}/{total:<6} {score:5.1f}%  {hung:>11}  "
        + "".join(f"{counts[status]:>8}  " for status in COLUMNS)
        + f"{other:>5}  {took:>7}"
    )


# --- the pytest plugin: mutmut's runs load this module with `-p bench.mutation_score` -------

TEST_DEADLINE_S = 30.0
"""Seconds a test may run. Unmutated, every selected test takes under 4 s, trampolines and all
(mutmut's stats and clean runs load this plugin too, and would stop here otherwise)."""

DEADLINE_KILLS = "deadline-kills.txt"
"""Where each mutant killed by the deadline is written: in mutants/, where pytest runs."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    timer = threading.Timer(TEST_DEADLINE_S, _past_deadline, args=(item.nodeid,))
    timer.daemon = True
    timer.start()
    try:
        return (yield)
    finally:
        timer.cancel()


def _past_deadline(nodeid: str) -> None:
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    with open(DEADLINE_KILLS, "a") as out:
        out.write(f"{mutant} {nodeid}\n")
    print(f"\n{nodeid} ran past {TEST_DEADLINE_S:.0f} s", file=sys.stderr, flush=True)
    os._exit(1)  # the hung loop cannot be interrupted; the whole run fails at once


if __name__ == "__main__":
    main()
