"""GRPO against SFT given the same training time, on greedy held-out correctness at several
budgets (20, 40 and 60 minutes by default). A benchmark, not a test.

Two arms start from the same model, with a run's config (`--config`):

- GRPO: `agentgym train` with its SFT warm-up, then GRPO. It evaluates on the held-out
  selection tasks every `eval.every` steps and keeps a checkpoint at each. It is stopped
  with SIGTERM (it checkpoints and stops) once its training time passes the last budget.
  Training time is the seconds of SFT's and GRPO's steps; evaluations are left out.
  It runs with `--resume auto`, so a rerun with the same `--out` goes on from its newest
  checkpoint, and under `/usr/bin/time -v` where there is one (peak RSS: `grpo/time.txt`).
- SFT: the same SFT, trained on with a fresh demonstration for every row. The model is
  evaluated as its training time passes each budget; its scores are kept in `sft_arm.json`.

At each budget, three models play greedily on the report tasks (the `eval.report_tasks`
after the selection's): the GRPO checkpoint that `checkpoint-best` would be among the
evaluations made by then (the best `eval/correctness`, the earliest among ties; SFT's
checkpoint before the first), the SFT checkpoint GRPO started from (`sft`), and the SFT
arm's model (`sft-long`). The table gives all three, and the paired bootstrap interval of
GRPO's difference from the better of `sft` and `sft-long`.

    python bench/grpo_vs_sft.py [--config configs/purchase.yaml] [--minutes 20 40 60]
        [--set K=V ...] [--out DIR] [--grpo-only]

`--grpo-only` runs the GRPO arm and stops: a seed's two arms (about an hour each on two
cores, with the evaluations) can then run in two sittings, the same command again doing
the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def grpo_arm(config: Path, sets: list[str], seconds: float, every: int, out: Path) -> None:
    """Trains until SFT's and GRPO's step seconds pass `seconds`, with a checkpoint at each
    held-out evaluation (every `every` steps); leaves the run in `out`."""
    if (out / "stopped").exists():
        return  # a rerun with the same --out evaluates the run it already has
    flags = [x for s in sets for x in ("--set", s)]
    cmd = [
        sys.executable, "-m", "agentgym", "train", "--config", str(config), "--steps", "100000",
        "--set", "eval.report_tasks=0", "--set", "sft.long=off", "--set", "run.keep_last=100000",
        "--set", f"run.save_every={every}", "--resume", "auto",
        "--output", str(out), *flags,
    ]  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    timed = Path("/usr/bin/time").exists()  # GNU time: the run's peak RSS
    if timed:
        cmd = ["/usr/bin/time", "-v", "-o", str(out / "time.txt"), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None:
        time.sleep(2)
        if training_seconds(out)[-1] >= seconds:
            # under time, signal the run (time waits for it and reports)
            for pid in (_children(proc.pid) if timed else []) or [proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            proc.wait()
    if proc.returncode not in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
        sys.exit(f"the GRPO arm's run failed (exit {proc.returncode}); see {out}")
    (out / "stopped").touch()


def _children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux); the run itself when `pid` is /usr/bin/time."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def training_seconds(out: Path) -> list[float]:
    """Training seconds after SFT and after each GRPO step (index k: after step k)."""
    total = [sum(r["step_seconds"] for r in _rows(out / "sft_metrics.jsonl"))]
    for row in _rows(out / "metrics.jsonl"):
        total.append(total[-1] + row["step_seconds"])
    return total


def grpo_choice(out: Path, seconds: float) -> tuple[int, Path]:
    """The step and checkpoint `checkpoint-best` would be after `seconds` of training."""
    clock, best, choice = training_seconds(out), -1.0, (0, out / "checkpoint-sft")
    for row in _rows(out / "metrics.jsonl"):
        if clock[row["step"]] > seconds:
            break
        folder = out / f"checkpoint-{row['step']:06d}"
        if row.get("eval/correctness") is not None and row["eval/correctness"] > best:
            best, choice = row["eval/correctness"], (row["step"], folder)
    return choice


def sft_arm(config, budgets: list[float], per_step: float, report) -> list[tuple[int, list]]:
    """(steps, report scores) of SFT at each budget of training seconds."""
    from agentgym.policy.hf import HFPolicy
    from agentgym.policy.models import load_configured, on_device
    from agentgym.run.setup import seed_everything
    from agentgym.sft.warmup import warm_up

    steps = math.ceil(1.5 * budgets[-1] / per_step) + 1
    s = config.sft.model_copy(
        update={"steps": steps, "demonstrations": steps * config.sft.batch_size}
    )
    config = config.model_copy(update={"sft": s})
    seed_everything(config.run.seed)
    model, tokenizer = load_configured(config.model.name, config.model)
    model = on_device(model, config)
    found: list[tuple[int, list]] = []
    clock = [0.0]

    class Done(Exception):
        pass

    def after_step(model, record) -> None:
        clock[0] += record["step_seconds"]
        while len(found) < len(budgets) and clock[0] >= budgets[len(found)]:
            found.append((record["step"], report(HFPolicy(model, tokenizer), tokenizer)))
            scores = found[-1][1]
            print(f"sft-long after {record['step']} steps ({clock[0]:.0f} s): greedy "
                  f"{sum(scores) / len(scores):.3f}", flush=True)  # fmt: skip
        if len(found) == len(budgets):
            raise Done

    with contextlib.suppress(Done):  # the last budget's evaluation ends it
        model, _ = warm_up(model, tokenizer, config, after_step=after_step)
    while len(found) < len(budgets):  # slower steps than GRPO's SFT: out of steps first
        print(f"SFT ran out of steps before {budgets[len(found)]:.0f} s: its last step stands in")
        found.append((steps, report(HFPolicy(model, tokenizer), tokenizer)))
    return found


def main() -> None:
    from agentgym.config_cli import load
    from agentgym.eval.heldout import HeldOut, held_out_ids
    from agentgym.eval.stats import paired_bootstrap
    from agentgym.policy.hf import HFPolicy
    from agentgym.policy.models import load_configured

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=Path("configs/purchase.yaml"))
    parser.add_argument("--minutes", type=float, nargs="+", default=[20, 40, 60])
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="K=V")
    parser.add_argument("--out", type=Path, default=Path("/tmp/grpo_vs_sft"))
    parser.add_argument("--grpo-only", action="store_true", help="stop after the GRPO arm")
    args = parser.parse_args()
    config = load(args.config, args.sets)
    budgets = [60 * m for m in sorted(args.minutes)]
    ev, run = config.eval, config.run
    ids = held_out_ids(run.env, run.env_kwargs, max(ev.report_tasks, 1), start=ev.tasks)

    def report(policy, tokenizer) -> list[float]:
        played = HeldOut.from_config(config, ids, tokenizer, n=0).run(policy, seed=run.seed)
        return [float(r.greedy.strict) for r in played]

    if ev.every == 0:
        parser.error("the GRPO arm chooses among held-out evaluations: set eval.every > 0")
    grpo_arm(args.config, args.sets, budgets[-1], ev.every, args.out / "grpo")
    if args.grpo_only:
        return
    sft_seconds = _rows(args.out / "grpo" / "sft_metrics.jsonl")
    per_step = sum(r["step_seconds"] for r in sft_seconds) / len(sft_seconds)
    kept = args.out / "sft_arm.json"  # a rerun after the SFT arm finished reuses its scores
    if not kept.exists():
        kept.write_text(json.dumps(sft_arm(config, budgets, per_step, report)))
    sft_long = json.loads(kept.read_text())

    def played(folder: Path) -> list[float]:
        model, tokenizer = load_configured(str(folder), config.model)
        return report(HFPolicy(model, tokenizer), tokenizer)

    sft = played(args.out / "grpo" / "checkpoint-sft")
    print(f"{len(ids)} report tasks, greedy strict correctness; seed {run.seed}; sft (the "
          f"checkpoint GRPO started from) {sum(sft) / len(sft):.3f}")  # fmt: skip
    print("budget   grpo step  grpo    sft-long steps  sft-long  grpo - max(sft, sft-long)")
    for budget, (sft_steps, long_scores) in zip(budgets, sft_long, strict=True):
        step, folder = grpo_choice(args.out / "grpo", budget)
        grpo = played(folder)
        better = max(sft, long_scores, key=sum)  # the better SFT model on these tasks
        mean, low, high = paired_bootstrap(grpo, better)
        print(
            f"{budget / 60:5.1f} min {step:9d}  {sum(grpo) / len(grpo):.3f}  {sft_steps:14d}  "
            f"{sum(long_scores) / len(long_scores):.3f}     {mean:+.3f} [{low:+.3f}, {high:+.3f}]",
            flush=True,
        )


if __name__ == "__main__":
    main()
