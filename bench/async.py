"""Benchmark (issue 38): what overlapping environment calls buys when tools wait on I/O.

Measured now: one rollout (`collect`, B tasks x G episodes) with the episodes' `env.reset`
and `env.step` calls made one after another (`run.env_workers: 1`, the peer: what every
release before this one did) against all at once (the default), side by side in this run,
sides alternating by round, on two environments whose calls wait:

- `latency`: three turns an episode, each `env.step` waiting `--latency-ms` (200) as a tool
  on an HTTP API would (a stand-in for the API, named as such: nothing here can reach one);
- `code`: agentgym/Code-v0 with the local sandbox (bubblewrap or unshare), each answer run
  against its tests in a fresh sandbox. The policy answers every task with one fixed
  program (a stand-in that writes code, so that every episode runs it).

The policy is tiny-random (built in code) for `latency`, so the rollout's own decoding is
small beside the waits.

`--train N` measures whole training runs of N GRPO steps, synchronous
(`pipeline.max_off_policy_steps: 0`, the peer) against asynchronous (k = 1), sides
alternating by round, and prints steps per minute of each and their ratio; on `latency`
(`--train-env`, the default; its reward the share of digits in the last reply, as a
stand-in that varies within groups) or on a registered env such as `agentgym/Code-v0`.

`--document-words N` puts a record of N words in each `latency` prompt: long observations
and short actions, where the learner's step outweighs the decoding (docs/results.md, "Where
async pays").

`--learning N` checks that asynchronous GRPO does not hurt learning: for 3 seeds, a
synchronous and an asynchronous (k = 1) run of N steps on `latency` (LoRA, the same tasks
for a seed), and whether the mean training reward of the async runs' last 20 steps lies
inside the 95 % interval (Student t, 2 degrees of freedom) of the sync runs'.

    .venv/bin/python bench/async.py
    .venv/bin/python bench/async.py --envs latency --tasks 4 --group 4 --rounds 3
    .venv/bin/python bench/async.py --envs none --train 8 --model tiny-random
    .venv/bin/python bench/async.py --envs none --train 6 --model tiny-random,embedded \
        --train-env bench_async/Latency-v0,agentgym/Code-v0 --latency-ms 5000
    .venv/bin/python bench/async.py --envs none --train 10 --model embedded --tasks 2 \
        --group 4 --rounds 1 --turns 1 --document-words 300 --latency-ms 40000 \
        --set sampling.max_new_tokens=8 --set grpo.num_iterations=2
    .venv/bin/python bench/async.py --envs none --learning 60
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import gymnasium as gym

from agentgym.cli import main as agentgym
from agentgym.env.core import AgentEnv, Feedback, Task, make_env
from agentgym.policy.base import Generation, SamplingParams
from agentgym.policy.hf import HFPolicy
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.rollout.episodes import TaskSpec, collect
from agentgym.types import Message

PROGRAM = "```python\ndef solve(*args, **kwargs):\n    return 0\n```"


WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "amber",
    "cobalt",
    "north",
    "river",
    "stone",
    "field",
    "ledger",
    "entry",
]


class LatencyEnv(AgentEnv):
    """Three turns; each `step` waits `latency_s` as a remote tool would, then answers.
    `document_words` > 0 puts a record of that many words in the prompt (long observations,
    short actions: the learner's forward and backward over them outweigh the decoding)."""

    def __init__(self, latency_s: float = 0.2, turns: int = 3, document_words: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.latency_s, self.turns, self.turn = latency_s, turns, 0
        self.document_words = document_words

    def num_tasks(self, split):
        return 64

    def task_id(self, split, index):
        return f"latency/{split}/{index}"

    def load_task(self, task_id):
        self.turn = 0
        index = int(task_id.rsplit("/", 1)[1])
        record = " ".join(WORDS[(index + 7 * i) % len(WORDS)] for i in range(self.document_words))
        prefix = f"Record {index}: {record}\n\n" if record else ""
        return Task(task_id=task_id, prompt=f"{prefix}Look up record {index}.")

    def respond(self, action):
        time.sleep(self.latency_s)  # the stand-in API's round trip
        self.turn += 1
        done = self.turn == self.turns
        reply = () if done else (Message("user", f"Record part {self.turn}: ok."),)
        digits = sum(c.isdigit() for c in action) / max(1, len(action))
        reward = digits if done else 0.0  # a stand-in that varies within a group
        return Feedback(reply, reward=reward, reward_parts={}, terminated=done)


class FixedProgramPolicy:
    """Answers every turn with `PROGRAM` (a stand-in policy: every episode runs code)."""

    def __init__(self, tokenizer):
        ids = tokenizer.encode(PROGRAM, add_special_tokens=False)
        self.ids = (*ids, tokenizer.eos_token_id)

    def generate(self, prompts, params, streams=None):
        return [Generation(self.ids, (-0.1,) * len(self.ids), "stop") for _ in prompts]


def _arms(name: str, args) -> tuple[list, object, object]:
    model, tokenizer = load_model_and_tokenizer("tiny-random")
    n = args.tasks * args.group
    if name == "latency":
        envs = [LatencyEnv(args.latency_ms / 1000) for _ in range(n)]
        return envs, HFPolicy(model, tokenizer), tokenizer
    envs = [make_env("code", families=["generated"]) for _ in range(n)]
    return envs, FixedProgramPolicy(tokenizer), tokenizer


def compare(name: str, args) -> float:
    """Prints each side's mean rollout seconds; returns serial / parallel."""
    envs, policy, tokenizer = _arms(name, args)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=0)
    seconds: dict[str, list[float]] = {"one after another": [], "at once": []}
    for r in range(args.rounds):
        specs = [TaskSpec(seed=1000 * r + t) for t in range(args.tasks)]
        sides = [("one after another", 1), ("at once", None)]
        for label, workers in sides if r % 2 == 0 else sides[::-1]:
            start = time.perf_counter()
            played = collect(
                envs, specs, args.group, policy, tokenizer, params, env_workers=workers
            )
            seconds[label].append(time.perf_counter() - start)
            assert not any(t.error for t in played), [t.error for t in played if t.error]
    for env in envs:
        env.close()
    turns = sum(len(t.turns) for t in played) / len(played)
    print(f"{name}: {args.tasks} tasks x G={args.group}, {turns:.1f} turns an episode, "
          f"{args.rounds} rounds")  # fmt: skip
    for label, values in seconds.items():
        print(f"  env calls {label:<18} {statistics.mean(values):7.2f} s a rollout")
    ratio = statistics.mean(seconds["one after another"]) / statistics.mean(seconds["at once"])
    print(f"  ratio at once / one after another: {ratio:.2f}x (aim: >= 1.5)")
    return ratio


def steps_per_minute(args) -> float:
    """Prints each side's steps per minute over whole `--train`-step runs (the steps' own
    seconds, `step_seconds`: model loading and checkpoints left out) and from step 2 on (an
    async run's first step has nothing to overlap with: the rate a long run tends to) and,
    for the synchronous side, the share of a step spent playing episodes; returns async /
    sync over whole runs."""
    rates: dict[int, list[float]] = {0: [], 1: []}
    later: dict[int, list[float]] = {0: [], 1: []}  # from step 2 on
    rollout_share: list[float] = []
    formatted: list[float] = []  # Code-v0: the share of episodes with a code block to run
    for r in range(args.rounds):
        for k in (0, 1) if r % 2 == 0 else (1, 0):
            with tempfile.TemporaryDirectory() as out:
                _train(args, out, k, args.train, *args.extra)
                lines = Path(out, "metrics.jsonl").read_text().splitlines()
                rows = [json.loads(x) for x in lines]
            seconds = sum(row["step_seconds"] for row in rows)
            rates[k].append(60 * len(rows) / seconds)
            if len(rows) > 1:
                later[k].append(60 * (len(rows) - 1) / (seconds - rows[0]["step_seconds"]))
            steps = " ".join(f"{row['step_seconds']:.1f}" for row in rows)
            print(f"  round {r + 1}, k={k}: {rates[k][-1]:.2f} steps/min; step seconds {steps}")
            if k == 0:
                rollout_share.append(sum(row["rollout_seconds"] for row in rows) / seconds)
            formatted += [
                r["format_accuracy"] for r in rows if r.get("format_accuracy") is not None
            ]
    playing = statistics.mean(rollout_share)
    print(
        f"training on {args.train_env} ({args.model}): {args.train} steps a run, {args.tasks} x "
        f"G={args.group}, {args.rounds} rounds; sync steps spend {playing:.0%} of their time "
        f"playing episodes; overlap hides at most the shorter side: about "
        f"{1 / max(playing, 1 - playing):.2f}x"
    )
    if formatted:
        print(f"  episodes with a well-formed answer (format_accuracy): "
              f"{statistics.mean(formatted):.0%}")  # fmt: skip
    for k, label in ((0, "sync"), (1, "async k=1")):
        print(f"  {label:<10} {statistics.mean(rates[k]):7.2f} steps/min")
    ratio = statistics.mean(rates[1]) / statistics.mean(rates[0])
    print(f"  ratio async / sync: {ratio:.2f}x (aim: >= 1.5 where tool latency is half the step)")
    if later[0]:
        steady = statistics.mean(later[1]) / statistics.mean(later[0])
        print(f"  from step 2 on: sync {statistics.mean(later[0]):.2f}, async "
              f"{statistics.mean(later[1]):.2f} steps/min, ratio {steady:.2f}x")  # fmt: skip
    return ratio


def _train(args, out: str, k: int, steps: int, *extra: str) -> None:
    argv = ["train", "--env", args.train_env, "--model", args.model, "--steps", str(steps),
            "--output", out, "--set", f"grpo.tasks_per_step={args.tasks}",
            "--set", f"grpo.group_size={args.group}", "--set", "sampling.max_new_tokens=16",
            "--set", "run.report_to=[]", "--set", f"run.save_every={steps}",
            "--set", "eval.every=0", "--set", f"pipeline.max_off_policy_steps={k}",
            *extra]  # fmt: skip
    assert agentgym(argv) == 0


def learning(args) -> bool:
    """Prints each run's mean training reward over its last 20 steps and whether the async
    runs' mean lies in the sync runs' 95 % interval; returns that."""
    tail: dict[int, list[float]] = {0: [], 1: []}
    lora = ("--set", "lora.enabled=true", "--set", "lora.r=8", "--set", f"optim.lr={args.lr}")
    for seed in (1, 2, 3):
        for k in (0, 1):
            with tempfile.TemporaryDirectory() as out:
                _train(args, out, k, args.learning, *lora, "--set", f"run.seed={seed}")
                lines = Path(out, "metrics.jsonl").read_text().splitlines()
                rows = [json.loads(x) for x in lines]
                tail[k].append(statistics.mean(r["reward/mean"] for r in rows[-20:]))
    sync, ahead = tail[0], tail[1]
    half = 4.303 * statistics.stdev(sync) / math.sqrt(len(sync))  # t(0.975, 2 dof)
    low, high = statistics.mean(sync) - half, statistics.mean(sync) + half
    inside = low <= statistics.mean(ahead) <= high
    print(f"learning on {args.train_env} ({args.model}, LoRA, lr {args.lr}, {args.turns} turns, "
          f"{args.tasks} x G={args.group}): {args.learning} steps a run, mean training reward "
          "of the last 20 steps, seeds 1-3")  # fmt: skip
    print(f"  sync      {' '.join(f'{x:.4f}' for x in sync)}  mean {statistics.mean(sync):.4f}"
          f"  95 % interval [{low:.4f}, {high:.4f}]")  # fmt: skip
    print(f"  async k=1 {' '.join(f'{x:.4f}' for x in ahead)}  mean {statistics.mean(ahead):.4f}"
          f"  {'inside' if inside else 'OUTSIDE'} the sync interval")  # fmt: skip
    return inside


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="latency,code")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--train", type=int, default=0, help="GRPO steps a training run")
    parser.add_argument("--model", default="tiny-random", help="for --train (a,b: each)")
    parser.add_argument(
        "--train-env", default="bench_async/Latency-v0", help="for --train (a,b: each)"
    )
    parser.add_argument(
        "--set",
        dest="extra",
        action="append",
        default=[],
        type=lambda s: f"--set={s}",
        help="for --train: a config override",
    )
    parser.add_argument("--learning", type=int, default=0, help="GRPO steps a learning run")
    parser.add_argument("--lr", type=float, default=5e-3, help="for --learning (LoRA)")
    parser.add_argument("--turns", type=int, default=3, help="turns of a latency episode")
    parser.add_argument(
        "--document-words", type=int, default=0, help="words of a record in a latency prompt"
    )
    args = parser.parse_args()
    for name in args.envs.split(","):
        if name != "none":
            compare(name, args)
    if args.train or args.learning:
        gym.register("bench_async/Latency-v0", entry_point=LatencyEnv, kwargs={
            "latency_s": args.latency_ms / 1000, "turns": args.turns,
            "document_words": args.document_words})  # fmt: skip
    if args.train:  # every model on every env, side by side in this run
        ratios = {}
        for model in args.model.split(","):
            for env in args.train_env.split(","):
                one = argparse.Namespace(**{**vars(args), "model": model, "train_env": env})
                ratios[env, model] = steps_per_minute(one)
        print("async / sync, steps per minute:")
        for (env, model), ratio in ratios.items():
            print(f"  {env:<28} {model:<12} {ratio:.2f}x")
    if args.learning:
        learning(args)


if __name__ == "__main__":
    main()
