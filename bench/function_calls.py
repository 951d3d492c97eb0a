"""What teaches calls to unseen functions when only a verifier exists: GRPO, rejection-sampling
fine-tuning, or more SFT on the easy demonstrations, for the same wall time. A benchmark, not
a test.

On `agentgym/FunctionCalls-v0` (`configs/function_calls.yaml`, the embedded model), per seed:

1. **Warm-up**: `agentgym sft` on demonstrations of levels 1-2 of the train APIs only (the
   format and the easy calls).
2. Three arms from that checkpoint, each for `--minutes` of wall time:
   - `grpo`: `agentgym train` on levels 1-5 of the train APIs, the verifier only, stopped by
     SIGTERM (it checkpoints and stops) when its time is up;
   - `rft`: `agentgym rft` (sample G per task, keep what the verifier passes, SFT on it,
     repeat) on the same tasks, temperature and group size, `rft.max_seconds`;
   - `sft`: `agentgym sft` continued on fresh level 1-2 demonstrations, for as many steps as
     fit in the time at the warm-up's mean step time.
3. Held-out greedy correctness (strict: the calls match as a whole) on `--tasks` tasks of
   each level of the **test APIs** (never trained on, distractors included), per level and
   per category, for the warm-up and each arm; 95 % paired bootstrap intervals of each arm
   against the warm-up and between arms, over the same tasks.

    python bench/function_calls.py --seed 0 [--minutes 20] [--tasks 40] [--out DIR]
    python bench/function_calls.py --table DIR     # the tables of every seed run so far
    python bench/function_calls.py --seed 0 --train-only [--arms grpo]  # checkpoints only

`--train-only` trains the warm-up and the `--arms` (default all) and evaluates nothing: what
`bench/bfcl_transfer.py` needs, which evaluates them on BFCL instead.

Every stage leaves its result in `DIR/seed<S>/`; a rerun skips what is done, so the arms
can run across sittings. Run it alone on the machine: the arms' wall time is the budget.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "function_calls.yaml"
ARMS = ("grpo", "rft", "sft")
LEVELS = (1, 2, 3, 4, 5)
EASY = "run.env_kwargs.difficulty=[1, 2]"


def agentgym(*args: str, log: Path, timeout_s: float | None = None) -> int:
    """Runs `python -m agentgym ARGS` with its output in `log`; SIGTERM after `timeout_s`."""
    cmd = [sys.executable, "-m", "agentgym", *args]
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            return process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)  # train checkpoints and stops
            return process.wait()


def sets(*items: str) -> list[str]:
    return [x for item in items for x in ("--set", item)]


def checkpoint(folder: Path) -> Path:
    """The newest complete checkpoint in a run folder."""
    found = sorted(folder.glob("checkpoint-[0-9]*"))
    if not found:
        raise SystemExit(f"{folder}: no checkpoint; see {folder.parent}/*.log")
    return found[-1]


def mean_step_seconds(folder: Path) -> float:
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    seconds = [r["step_seconds"] for r in rows if "step_seconds" in r]
    return sum(seconds) / len(seconds)


def warm_up(out: Path, seed: int, extra: list[str]) -> Path:
    folder = out / "warmup"
    if not (folder / "done").exists():
        flags = sets(EASY, f"run.seed={seed}", *extra)
        code = agentgym(
            "sft", "--config", str(CONFIG), "--output", str(folder), *flags, log=out / "warmup.log"
        )
        if code != 0:
            raise SystemExit(f"the warm-up failed ({code}); see {out}/warmup.log")
        (folder / "done").write_text(str(checkpoint(folder)))
    return Path((folder / "done").read_text())


def arm(
    name: str,
    out: Path,
    start: Path,
    seed: int,
    seconds: float,
    extra: list[str],
    step_seconds: float | None = None,
) -> Path:
    """Trains arm `name` from `start` for `seconds` of wall time; its checkpoint. The SFT
    arm's steps are the seconds over `step_seconds` (default: the warm-up's mean step)."""
    folder = out / name
    if (folder / "done").exists():
        return Path((folder / "done").read_text())
    common = ["--config", str(CONFIG), "--model", str(start), "--output", str(folder)]
    common += sets(*extra)
    began = time.monotonic()
    seeded = f"run.seed={seed}"
    if name == "grpo":
        code = agentgym("train", *common, *sets(seeded), log=out / "grpo.log", timeout_s=seconds)
    elif name == "rft":
        budget = sets(seeded, f"rft.max_seconds={seconds}", "rft.rounds=100000")
        code = agentgym("rft", *common, *budget, log=out / "rft.log")
    else:
        steps = max(1, round(seconds / (step_seconds or mean_step_seconds(out / "warmup"))))
        more = sets(EASY, seeded, f"sft.steps={steps}", f"sft.demonstrations={steps * 8}")
        code = agentgym("sft", *common, *more, log=out / "sft.log")
    wall = time.monotonic() - began
    if code not in (0, -signal.SIGTERM, 128 + signal.SIGTERM, 1):
        raise SystemExit(f"arm {name} failed ({code}); see {out}/{name}.log")
    found = checkpoint(folder)
    (folder / "wall_seconds").write_text(f"{wall:.0f}")
    (folder / "done").write_text(str(found))
    return found


def evaluate(model: Path, name: str, out: Path, tasks: int, extra: list[str]) -> dict:
    """Greedy test-API results per level, {level: [task records]}, from one evaluation of
    the levels interleaved (task i of the split is of level `LEVELS[i % 5]`)."""
    folder = out / "eval" / name
    if not (folder / "report.json").exists():
        every = f"run.env_kwargs.difficulty={list(LEVELS)}"
        agentgym("eval", "--config", str(CONFIG), "--model", str(model), "--split", "test",
                 "--tasks", str(tasks * len(LEVELS)), "--output", str(folder),
                 *sets(every, *extra), log=out / "eval.log")  # fmt: skip
    records = json.loads((folder / "report.json").read_text())["tasks"]["model"]
    return {
        str(level): [r for r in records if r["task_id"].startswith(f"level{level}/")]
        for level in LEVELS
    }


def run_seed(out: Path, seed: int, args: argparse.Namespace) -> None:
    """The warm-up and the `args.arms`, then (unless `args.train_only`) their evaluations."""
    minutes, tasks, extra, step_seconds = args.minutes, args.tasks, args.sets, args.sft_step_seconds
    out.mkdir(parents=True, exist_ok=True)
    start = warm_up(out, seed, extra)
    models = {"warmup": start}
    for name in args.arms:
        models[name] = arm(name, out, start, seed, 60 * minutes, extra, step_seconds)
    if args.train_only:
        print("\n".join(f"{name}: {path}" for name, path in models.items()), flush=True)
        return
    scores = {name: evaluate(path, name, out, tasks, extra) for name, path in models.items()}
    (out / "scores.json").write_text(json.dumps(scores))
    print(table(out), flush=True)


# -- the tables ------------------------------------------------------------------------------


def strict(records: list[dict]) -> list[float]:
    return [float(r["greedy"]["strict"]) for r in records]


def interval(a: list[float], b: list[float]) -> str:
    from agentgym.eval.stats import paired_bootstrap

    mean, low, high = paired_bootstrap(a, b)
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"


def table(out: Path) -> str:
    """One seed's markdown tables: per level and per category, and the intervals."""
    scores = json.loads((out / "scores.json").read_text())
    names = ["warmup", *ARMS]
    rows = {
        **{f"level {lv}": {n: scores[n][lv] for n in names} for lv in map(str, LEVELS)},
        "all": {n: [r for lv in map(str, LEVELS) for r in scores[n][lv]] for n in names},
    }
    cats = sorted({r["category"] for lv in scores["warmup"].values() for r in lv})
    for cat in cats:
        rows[cat] = {n: [r for r in rows["all"][n] if r["category"] == cat] for n in names}
    walls = {n: (out / n / "wall_seconds").read_text() for n in ARMS}
    lines = [
        f"seed {out.name.removeprefix('seed')}: greedy strict correctness on the test APIs; "
        f"wall seconds {walls}",
        "",
        "| tasks | n | " + " | ".join(names) + " | grpo - warmup | rft - warmup | sft - warmup "
        "| grpo - rft | grpo - sft | rft - sft |",
        "|" + " --- |" * (2 + len(names) + 6),
    ]
    pairs = [("grpo", "warmup"), ("rft", "warmup"), ("sft", "warmup"),
             ("grpo", "rft"), ("grpo", "sft"), ("rft", "sft")]  # fmt: skip
    for label, by_model in rows.items():
        s = {n: strict(by_model[n]) for n in names}
        means = " | ".join(f"{sum(v) / len(v):.3f}" for v in s.values())
        diffs = " | ".join(interval(s[a], s[b]) for a, b in pairs)
        lines.append(f"| {label} | {len(s['warmup'])} | {means} | {diffs} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, nargs="+", default=[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--tasks", type=int, default=40, help="test tasks per level")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-function-calls")
    parser.add_argument("--table", type=Path, help="print the tables of the seeds run in it")
    smoke = "a config override of every run (smoke: model.name=tiny-random)"
    parser.add_argument("--set", dest="sets", action="append", default=[], help=smoke)
    busy = "the SFT arm's seconds per step, where the warm-up's (the default) ran on a busy machine"
    parser.add_argument("--sft-step-seconds", type=float, help=busy)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--train-only", action="store_true", help="evaluate nothing")
    args = parser.parse_args()
    if not args.train_only and tuple(args.arms) != ARMS:
        parser.error("--arms trains a part of the arms: give --train-only with it")
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    if args.table:
        for folder in sorted(args.table.glob("seed*")):
            if (folder / "scores.json").exists():
                print(table(folder), "\n")
        return
    for seed in args.seed:
        run_seed(args.out / f"seed{seed}", seed, args)


if __name__ == "__main__":
    main()
