"""Credit per turn and dynamic sampling, measured: episode against turn credit, with and
without dynamic sampling, from the same SFT start, for the same wall time. A benchmark,
not a test.

On `agentgym/ToolCall-v0`'s multi-turn tasks (`--families`, default the `chain` family:
each call's result feeds the next; `--difficulty`, default 2), with the default run's
config (`configs/tool_call.yaml`: the embedded model, LoRA), per seed:

1. **Warm-up**: `agentgym sft` on the env's demonstrations (the config's `sft` section).
2. Four arms from that checkpoint, each `agentgym train` for `--minutes` of wall time
   (stopped by SIGTERM: it checkpoints and stops), a checkpoint every `--save-every`
   steps: `episode` (GRPO's), `turn` (`grpo.credit: turn`), and each with
   `grpo.dynamic_sampling: true`.
3. Held-out greedy correctness of the warm-up and of every arm's checkpoints on `--tasks`
   test tasks, against each checkpoint's wall time (the seconds of its steps, from its
   `metrics.jsonl`); each against the warm-up, and turn against episode, with 95 % paired
   bootstrap intervals over the same tasks, pooled over the seeds run.

    python bench/credit.py --seed 0 1 2 [--minutes 20] [--tasks 40] [--out DIR]
    python bench/credit.py --table DIR

Every stage leaves its result in `DIR/seed<S>/`; a rerun skips what is done, so seeds and
arms can run across sittings. Run it alone on the machine: the arms' wall time is the budget.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from function_calls import agentgym, checkpoint, interval, sets, strict  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "tool_call.yaml"
ARMS = {
    "episode": (),
    "turn": ("grpo.credit=turn",),
    "episode+dynamic": ("grpo.dynamic_sampling=true",),
    "turn+dynamic": ("grpo.credit=turn", "grpo.dynamic_sampling=true"),
}


def env_sets(families: list[str], difficulty: int) -> list[str]:
    """The tasks, and room for their episodes: the default run's config sizes calculator
    tasks (3 turns of 64 tokens), but a chain task at difficulty 2 is 4 turns of up to 105
    tokens in its demonstrations (SmolLM2's tokenizer, 40 train tasks), so with the config's
    budget every episode was cut off and every checkpoint scored 0."""
    room = ["run.env_kwargs.max_turns=5", "sampling.max_new_tokens=128",
            "eval.max_new_tokens=128", "sampling.max_episode_tokens=1280"]  # fmt: skip
    return [f"run.env_kwargs.families={families}", f"run.env_kwargs.difficulty={difficulty}",
            *room]  # fmt: skip


def warm_up(out: Path, seed: int, extra: list[str]) -> Path:
    folder = out / "warmup"
    if not (folder / "done").exists():
        flags = sets(f"run.seed={seed}", *extra)
        code = agentgym("sft", "--config", str(CONFIG), "--output", str(folder), *flags,
                        log=out / "warmup.log")  # fmt: skip
        if code != 0:
            raise SystemExit(f"the warm-up failed ({code}); see {out}/warmup.log")
        (folder / "done").write_text(str(checkpoint(folder)))
    return Path((folder / "done").read_text())


def arm(name: str, out: Path, start: Path, seed: int, seconds: float, every: int,
        extra: list[str]) -> Path:  # fmt: skip
    """Trains arm `name` from `start` for `seconds` of wall time; its run folder."""
    folder = out / name
    if not (folder / "done").exists():
        flags = sets(f"run.seed={seed}", "sft.warmup=false", "eval.every=0",
                     "eval.report_tasks=0", f"run.save_every={every}", "run.keep_last=100000",
                     *ARMS[name], *extra)  # fmt: skip
        code = agentgym("train", "--config", str(CONFIG), "--model", str(start), "--steps",
                        "100000", "--output", str(folder), *flags, log=out / f"{name}.log",
                        timeout_s=seconds)  # fmt: skip
        if code not in (0, -15, 128 + 15, 1):
            raise SystemExit(f"arm {name} failed ({code}); see {out}/{name}.log")
        checkpoint(folder)
        (folder / "done").write_text(str(code))
    return folder


def wall_minutes(folder: Path) -> dict[int, float]:
    """step -> minutes of step time up to it (the arm's training time; none before a step)."""
    path = folder / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    total, out = 0.0, {}
    for r in rows:
        if "step_seconds" in r:
            total += r["step_seconds"]
            out[int(r["step"])] = total / 60
    return out


def evaluate(model: Path, label: str, out: Path, tasks: int, extra: list[str]) -> list[dict]:
    """Greedy test-task records of `model` (one evaluation, kept in `out/eval/label`)."""
    folder = out / "eval" / label
    if not (folder / "report.json").exists():
        agentgym("eval", "--config", str(CONFIG), "--model", str(model), "--split", "test",
                 "--tasks", str(tasks), "--output", str(folder), *sets(*extra),
                 log=out / "eval.log")  # fmt: skip
    return json.loads((folder / "report.json").read_text())["tasks"]["model"]


def run_seed(out: Path, seed: int, args: argparse.Namespace) -> None:
    out.mkdir(parents=True, exist_ok=True)
    extra = [*env_sets(args.families, args.difficulty), *args.sets]
    start = warm_up(out, seed, extra)
    scores: dict[str, dict] = {"warmup": {"0": [0.0, evaluate(start, "warmup", out,
                                                               args.tasks, extra)]}}  # fmt: skip
    for name in ARMS:
        folder = arm(name, out, start, seed, 60 * args.minutes, args.save_every, extra)
        minutes = wall_minutes(folder)
        scores[name] = {}
        for ckpt in sorted(folder.glob("checkpoint-[0-9]*")):
            step = int(ckpt.name.split("-")[1])
            label = f"{name}-{step}"
            records = evaluate(ckpt, label, out, args.tasks, extra)
            scores[name][str(step)] = [minutes.get(step, 0.0), records]
    (out / "scores.json").write_text(json.dumps(scores))


def table(out: Path) -> str:
    """Every arm's checkpoints against wall time, pooled over the seeds run in `out`."""
    seeds = [json.loads(p.read_text()) for p in sorted(out.glob("seed*/scores.json"))]
    if not seeds:
        raise SystemExit(f"{out}: no seed has finished (seed*/scores.json)")
    base = [x for s in seeds for x in strict(s["warmup"]["0"][1])]
    lines = [
        f"{len(seeds)} seed(s): greedy strict correctness on the test tasks, pooled; each "
        "checkpoint against the warm-up, and turn against episode at the same checkpoint "
        "index, with 95 % paired bootstrap intervals",
        "",
        "| arm | checkpoint | minutes (mean) | correctness | - warm-up | turn - episode |",
        "|" + " --- |" * 6,
        f"| warm-up | - | 0 | {sum(base) / len(base):.3f} | | |",
    ]
    for name in ARMS:
        common = set.intersection(*(set(s[name]) for s in seeds))
        for index, step in enumerate(sorted(common, key=int)):
            values = [x for s in seeds for x in strict(s[name][step][1])]
            minutes = sum(s[name][step][0] for s in seeds) / len(seeds)
            versus = ""
            if name.startswith("turn"):
                other = name.replace("turn", "episode")
                steps = sorted(set.intersection(*(set(s[other]) for s in seeds)), key=int)
                if index < len(steps):
                    paired = [x for s in seeds for x in strict(s[other][steps[index]][1])]
                    versus = interval(values, paired)
            cells = f"{sum(values) / len(values):.3f} | {interval(values, base)} | {versus}"
            lines.append(f"| {name} | {step} | {minutes:.1f} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, nargs="+", default=[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--tasks", type=int, default=40, help="held-out test tasks")
    parser.add_argument("--families", nargs="+", default=["chain"])
    parser.add_argument("--difficulty", type=int, default=2)
    parser.add_argument("--save-every", type=int, default=4, help="steps between checkpoints")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-credit")
    parser.add_argument("--table", type=Path, help="print the table of the seeds run in it")
    smoke = "a config override of every run (smoke: model.name=tiny-random)"
    parser.add_argument("--set", dest="sets", action="append", default=[], help=smoke)
    args = parser.parse_args()
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    if args.table:
        print(table(args.table))
        return
    for seed in args.seed:
        run_seed(args.out / f"seed{seed}", seed, args)
    print(table(args.out))


if __name__ == "__main__":
    main()
