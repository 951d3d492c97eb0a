"""Credit per turn and dynamic sampling, measured: episode against turn credit, with and
without dynamic sampling, from the same SFT start, for the same wall time. A benchmark,
not a test.

On `agentgym/ToolCall-v0`'s multi-turn tasks (`--families`, default the `chain` family:
each call's result feeds the next; `--difficulty`, default 1), with the default run's
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
    python bench/credit.py --table [RECORD]

Every stage leaves its result in `DIR/seed<S>/`; a rerun skips what is done. Each arm, once
its checkpoints are evaluated, is also recorded in `--record` (`bench/records/credit/`,
kept in git: a few kB of scores per arm), so seeds and arms can run across sittings on
fresh machines: a rerun skips a recorded arm, and trains the warm-up again only for the
arms left, refusing to go on if its weights differ from the recorded warm-up's (the same
seed on the same machine gives the same bytes). Run it alone on the machine: the arms'
wall time is the budget.
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
RECORD = ROOT / "bench" / "records" / "credit"
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
    """Greedy test-task records of `model` (one evaluation, kept in `out/eval/label`): greedy
    only (`eval.n=0`), as the table reads; the config's 4 sampled episodes a task made each
    evaluation 5x as long."""
    folder = out / "eval" / label
    if not (folder / "report.json").exists():
        agentgym("eval", "--config", str(CONFIG), "--model", str(model), "--split", "test",
                 "--tasks", str(tasks), "--output", str(folder), *sets("eval.n=0", *extra),
                 log=out / "eval.log")  # fmt: skip
    return json.loads((folder / "report.json").read_text())["tasks"]["model"]


def weights_sha(folder: Path) -> str:
    """The sha256 of a checkpoint's weights, from its MANIFEST.json (what a rerun's warm-up
    must reproduce for its arms to share the recorded arms' start)."""
    files = json.loads((folder / "MANIFEST.json").read_text())["files"]
    return ",".join(v["sha256"] for k, v in sorted(files.items()) if k.endswith(".safetensors"))


def run_seed(out: Path, record: Path, seed: int, args: argparse.Namespace) -> None:
    """The warm-up and every arm not yet in `record`, each recorded once evaluated."""
    left = [n for n in ("warmup", *ARMS) if not (record / f"{n}.json").exists()]
    if not left:
        return
    settings = {k: getattr(args, k) for k in ("families", "difficulty", "minutes", "tasks",
                                              "save_every", "sets")}  # fmt: skip
    if "warmup" not in left:
        _same_settings(record / "warmup.json", settings)
    out.mkdir(parents=True, exist_ok=True)
    record.mkdir(parents=True, exist_ok=True)
    extra = [*env_sets(args.families, args.difficulty), *args.sets]
    start = warm_up(out, seed, extra)
    sha = weights_sha(start)
    if "warmup" in left:
        scores = {"0": [0.0, evaluate(start, "warmup", out, args.tasks, extra)]}
        _keep(record / "warmup.json", sha, scores, settings)
    kept = json.loads((record / "warmup.json").read_text())["start"]
    if kept != sha:
        raise SystemExit(f"the warm-up's weights ({sha}) differ from the recorded one's ({kept}, "
                         f"{record}/warmup.json): its arms would not share a start")  # fmt: skip
    for name in [n for n in ARMS if n in left]:
        folder = arm(name, out, start, seed, 60 * args.minutes, args.save_every, extra)
        minutes = wall_minutes(folder)
        scores = {}
        for ckpt in sorted(folder.glob("checkpoint-[0-9]*")):
            step = int(ckpt.name.split("-")[1])
            records = evaluate(ckpt, f"{name}-{step}", out, args.tasks, extra)
            scores[str(step)] = [minutes.get(step, 0.0), records]
        _keep(record / f"{name}.json", sha, scores)


def _keep(path: Path, sha: str, scores: dict, settings: dict | None = None) -> None:
    """An arm's scores (checkpoint step -> [minutes, test records]) and its start; the
    warm-up's also the bench's settings, which every later arm of the seed must share."""
    kept = {"start": sha, "scores": scores, **({"settings": settings} if settings else {})}
    path.write_text(json.dumps(kept, sort_keys=True) + "\n")


def _same_settings(warmup: Path, settings: dict) -> None:
    """SystemExit naming the settings that differ from those `warmup` was recorded with."""
    kept = json.loads(warmup.read_text()).get("settings", {})
    differ = [f"{k}: {kept.get(k)!r} recorded, {v!r} now" for k, v in settings.items()
              if kept.get(k) != v]  # fmt: skip
    if differ:
        raise SystemExit(f"{warmup.parent}'s arms ran with other settings "
                         f"({'; '.join(differ)}); give them, or another --record")  # fmt: skip


def recorded(record: Path) -> list[dict[str, dict]]:
    """Each seed's recorded arms (name -> scores), for the seeds whose warm-up is recorded."""
    seeds = []
    for folder in sorted(record.glob("seed*")):
        arms = {p.stem: json.loads(p.read_text())["scores"] for p in folder.glob("*.json")}
        if "warmup" in arms:
            seeds.append(arms)
    return seeds


def table(record: Path) -> str:
    """Every arm's checkpoints against wall time, pooled over the seeds that ran it."""
    seeds = recorded(record)
    if not seeds:
        raise SystemExit(f"{record}: no seed's warm-up is recorded (seed*/warmup.json)")
    base = [x for s in seeds for x in strict(s["warmup"]["0"][1])]
    lines = [
        "greedy strict correctness on the test tasks, pooled over the seeds that ran each arm; "
        "each checkpoint against the warm-up, and turn against episode at the same checkpoint "
        "index, with 95 % paired bootstrap intervals",
        "",
        "| arm | seeds | checkpoint | minutes (mean) | correctness | - warm-up | turn - episode |",
        "|" + " --- |" * 7,
        f"| warm-up | {len(seeds)} | - | 0 | {sum(base) / len(base):.3f} | | |",
    ]
    for name in ARMS:
        ran = [s for s in seeds if name in s]
        if not ran:
            lines.append(f"| {name} | 0 | not run yet | | | | |")
            continue
        warm = [x for s in ran for x in strict(s["warmup"]["0"][1])]
        common = set.intersection(*(set(s[name]) for s in ran))
        for index, step in enumerate(sorted(common, key=int)):
            values = [x for s in ran for x in strict(s[name][step][1])]
            minutes = sum(s[name][step][0] for s in ran) / len(ran)
            versus = _versus(name, index, ran)
            cells = f"{sum(values) / len(values):.3f} | {interval(values, warm)} | {versus}"
            lines.append(f"| {name} | {len(ran)} | {step} | {minutes:.1f} | {cells} |")
    return "\n".join(lines)


def _versus(name: str, index: int, ran: list[dict[str, dict]]) -> str:
    """A turn arm's checkpoint `index` against its episode arm's, over the seeds with both."""
    other = name.replace("turn", "episode")
    both = [s for s in ran if other in s]
    if not name.startswith("turn") or not both:
        return ""
    mine = sorted(set.intersection(*(set(s[name]) for s in both)), key=int)
    theirs = sorted(set.intersection(*(set(s[other]) for s in both)), key=int)
    if index >= min(len(mine), len(theirs)):
        return ""
    values = [x for s in both for x in strict(s[name][mine[index]][1])]
    paired = [x for s in both for x in strict(s[other][theirs[index]][1])]
    return interval(values, paired)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, nargs="+", default=[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--tasks", type=int, default=40, help="held-out test tasks")
    parser.add_argument("--families", nargs="+", default=["chain"])
    hard = "at 2 the warm-up scored 0.000 (40 tasks, 97.5 % cut off), leaving GRPO no signal"
    parser.add_argument("--difficulty", type=int, default=1, help=f"default 1: {hard}")
    parser.add_argument("--save-every", type=int, default=4, help="steps between checkpoints")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-credit")
    parser.add_argument("--record", type=Path, default=RECORD, help="where arms are recorded")
    parser.add_argument("--table", type=Path, nargs="?", const=RECORD,
                        help="print the table of the arms recorded in it")  # fmt: skip
    smoke = "a config override of every run (smoke: model.name=tiny-random)"
    parser.add_argument("--set", dest="sets", action="append", default=[], help=smoke)
    args = parser.parse_args()
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    if args.table:
        print(table(args.table))
        return
    for seed in args.seed:
        run_seed(args.out / f"seed{seed}", args.record / f"seed{seed}", seed, args)
    print(table(args.record))


if __name__ == "__main__":
    main()
