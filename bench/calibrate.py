"""Which difficulty level leaves room for GRPO after the SFT warm-up? A measurement, not a test.

For each level: `agentgym sft` with a run's config (the default run's unless `--config`)
at `run.env_kwargs.difficulty=<level>`, then the SFT checkpoint's greedy correctness on
the calibration tasks: held-out test tasks disjoint from both the ones that choose
`checkpoint-best` (the split's first `eval.tasks`) and the closing table's (the next
`eval.report_tasks`), i.e. the `--tasks` after them. Printed per level: the SFT steps,
greedy correctness with its 95 % bootstrap interval over the tasks, the mean tokens and
turns of an episode, and the wall time of SFT and of the evaluation.

The default run wants a level whose correctness sits between 0.3 and 0.7: room to gain,
and enough right answers for GRPO's groups to have a reward spread. `--sft-steps 12 24`
measures each level at several SFT lengths: whether SFT is at its plateau.

    python bench/calibrate.py [--config configs/tool_call.yaml] [--levels 1 2 3]
        [--sft-steps 12] [--tasks 60] [--set run.env_kwargs.families=[purchase]] [--out DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path


def sft(config: Path, sets: list[str], steps: int, folder: Path) -> Path:
    """Runs `agentgym sft` (once per folder: a rerun reuses it); its checkpoint folder."""
    done = sorted(folder.glob("checkpoint-*/COMPLETE"))
    if not done:
        cmd = [
            sys.executable, "-m", "agentgym", "sft", "--config", str(config),
            "--steps", str(steps), "--output", str(folder), *sets,
        ]  # fmt: skip
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        done = sorted(folder.glob("checkpoint-*/COMPLETE"))
    return done[-1].parent


def greedy(config_path: Path, overrides: list[str], checkpoint: Path, tasks: int) -> dict:
    """The checkpoint's greedy figures on the calibration tasks."""
    from agentgym.config_cli import load
    from agentgym.eval.heldout import HeldOut, held_out_ids
    from agentgym.eval.report import summarize
    from agentgym.eval.stats import paired_bootstrap
    from agentgym.policy.hf import HFPolicy
    from agentgym.policy.models import load_configured

    config = load(config_path, overrides)
    run, ev = config.run, config.eval
    start = ev.tasks + ev.report_tasks
    ids = held_out_ids(run.env, run.env_kwargs, tasks, start=start, split=ev.split)
    model, tokenizer = load_configured(str(checkpoint), config.model)
    held_out = HeldOut.from_config(config, ids, tokenizer, n=0)
    results = held_out.run(HFPolicy(model, tokenizer), seed=run.seed)
    g = summarize(results).greedy
    scores = [float(r.greedy.strict) for r in results]
    mean, low, high = paired_bootstrap(scores, [0.0] * len(scores))
    return {
        "correct": mean,
        "low": low,
        "high": high,
        "tokens": g.completion_length,
        "turns": g.turns,
        "first": start,
        "tasks": len(ids),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=Path("configs/tool_call.yaml"))
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--sft-steps", type=int, nargs="+", default=[12])
    parser.add_argument("--tasks", type=int, default=60, help="calibration tasks per level")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="K=V")
    parser.add_argument("--out", type=Path, default=Path("/tmp/calibrate"))
    args = parser.parse_args()
    head = f"{'level':>5} {'sft':>4}  {'greedy correct [95% interval]':<32}"
    print(f"{head} tokens  turns  sft s  eval s")
    for level in args.levels:
        sets = [*args.sets, f"run.env_kwargs.difficulty={level}"]
        flags = [x for s in sets for x in ("--set", s)]
        for steps in args.sft_steps:
            start = time.perf_counter()
            checkpoint = sft(args.config, flags, steps, args.out / f"level{level}-sft{steps}")
            trained = time.perf_counter() - start
            f = greedy(args.config, sets, checkpoint, args.tasks)
            played = time.perf_counter() - start - trained
            interval = f"{f['correct']:.3f} [{f['low']:.3f}, {f['high']:.3f}]"
            print(
                f"{level:>5} {steps:>4}  {interval:<32} {f['tokens']:>6.1f} {f['turns']:>6.2f} "
                f"{trained:>6.0f} {played:>7.0f}",
                flush=True,
            )
    last = f["first"] + f["tasks"] - 1
    print(f"(test tasks {f['first']} to {last}: after the selection and report tasks)")


if __name__ == "__main__":
    main()
