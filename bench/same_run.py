"""Digests of a short training run, to show that a refactor changed no behaviour.

Run from a checkout's root: `python bench/same_run.py tiny --out /tmp/a.json`. It trains
with the CLI (`python -m agentgym train`) in a fresh directory and writes a JSON of
sha256 digests: each `metrics.jsonl` row without its timing fields, and each weight
file of every checkpoint. Two checkouts that print the same JSON trained bitwise the
same. `--compare A.json B.json` says which entries differ.

- `tiny`: tiny-random, 3 GRPO steps on `cli_envs/Digits-v0` (rewards vary within groups,
  so the weights move), LoRA, a cosine schedule and a beta schedule; plus an SFT warm-up
  and held-out evaluations on `cli_envs/TaughtDigits-v0` in a second run.
- `matrix`: tiny-random on `cli_envs/Digits-v0` in four configurations: LoRA and full
  fine-tuning, each once with a user reward function (`reward_fns_fixture:digit_share`)
  and one task per step, once with a length penalty and two tasks per step.
- `async`: `tiny`'s GRPO run asynchronous (`pipeline.max_off_policy_steps=1`); plus held-out
  evaluations on `cli_envs/TaughtDigits-v0` during an asynchronous run in a second run.
- `agent`: the agent program `docs/tool_agent.py:agent` on `tool_call` and tiny-random,
  played through the endpoint, with held-out evaluations; `digit_share` as a reward
  function, for `tool_call`'s own reward is the same for each of a random model's replies.
- `ray`: tiny-random on `cli_envs/Digits-v0` with its rollouts on two Ray workers (the CLI
  starts a local Ray on the machine's CPUs).
- `default`: the default run (`configs/tool_call.yaml`, the embedded model) cut to its
  first 3 GRPO steps.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TIMING = {
    "step_seconds", "rollout_seconds", "tokens_per_second",
    "rollout/weight_sync_seconds", "rollout/sync_seconds",
}  # fmt: skip
TINY = [
    "--env", "cli_envs:cli_envs/Digits-v0", "--model", "tiny-random",
    "--set", "lora.enabled=true", "--set", "lora.r=4", "--set", "optim.lr=5e-3",
    "--set", "optim.lr_scheduler=cosine", "--set", "optim.warmup_steps=1",
    "--set", "grpo.beta=0.04", "--set", "grpo.beta_start=0.01",
    "--set", "grpo.beta_warmup_steps=3", "--set", "grpo.group_size=4",
    "--set", "grpo.tasks_per_step=4", "--set", "sampling.max_new_tokens=12",
    "--set", "run.report_to=[]", "--set", "run.save_every=2", "--set", "run.steps=3",
]  # fmt: skip
TINY_SFT_EVAL = [
    *TINY, "--env", "cli_envs:cli_envs/TaughtDigits-v0",
    "--set", "sft.warmup=true", "--set", "sft.steps=2", "--set", "sft.demonstrations=4",
    "--set", "sft.batch_size=2", "--set", "eval.every=2", "--set", "eval.tasks=2",
    "--set", "eval.report_tasks=2", "--set", "eval.n=2",
]  # fmt: skip
BASE = [
    "--env", "cli_envs:cli_envs/Digits-v0", "--model", "tiny-random", "--set", "optim.lr=5e-3",
    "--set", "grpo.beta=0.04", "--set", "grpo.group_size=4", "--set", "sampling.max_new_tokens=12",
    "--set", "run.report_to=[]", "--set", "run.save_every=2", "--set", "run.steps=3",
]  # fmt: skip
LORA = ["--set", "lora.enabled=true", "--set", "lora.r=4"]
FULL = ["--set", "lora.enabled=false"]
DIGIT_SHARE = ["--set", "rewards.functions=[{fn: 'reward_fns_fixture:digit_share', weight: 0.5}]"]
REWARD_ONE = [*DIGIT_SHARE, "--set", "grpo.tasks_per_step=1"]
PENALTY_TWO = ["--set", "grpo.length_penalty=0.01", "--set", "grpo.tasks_per_step=2"]
MATRIX = {
    "lora_reward_one": [*BASE, *LORA, *REWARD_ONE],
    "lora_penalty_two": [*BASE, *LORA, *PENALTY_TWO],
    "full_reward_one": [*BASE, *FULL, *REWARD_ONE],
    "full_penalty_two": [*BASE, *FULL, *PENALTY_TWO],
}
ASYNC = [*TINY, "--set", "pipeline.max_off_policy_steps=1"]
ASYNC_EVAL = [
    *ASYNC, "--env", "cli_envs:cli_envs/TaughtDigits-v0", "--set", "eval.every=2",
    "--set", "eval.tasks=2", "--set", "eval.report_tasks=2", "--set", "eval.n=2",
]  # fmt: skip
AGENT = [
    "--env", "tool_call", "--model", "tiny-random", "--agent", "docs/tool_agent.py:agent",
    "--set", "grpo.tasks_per_step=2", "--set", "grpo.group_size=2",
    "--set", "sampling.max_new_tokens=16", "--set", "run.steps=3", "--set", "run.save_every=2",
    "--set", "eval.every=2", "--set", "eval.tasks=2", "--set", "eval.report_tasks=0",
    "--set", "run.report_to=[]", "--set", "optim.lr=5e-3", *DIGIT_SHARE,
]  # fmt: skip
RAY = [
    *BASE, "--set", "grpo.tasks_per_step=3", "--set", "distributed.backend=ray",
    "--set", "distributed.rollout_workers=2",
]  # fmt: skip
DEFAULT = ["--env", "tool_call", "--config", "configs/tool_call.yaml", "--set", "run.steps=3"]
RUNS = {
    "tiny": {"grpo": TINY, "sft_eval": TINY_SFT_EVAL},
    "matrix": MATRIX,
    "async": {"grpo": ASYNC, "eval": ASYNC_EVAL},
    "agent": {"agent": AGENT},
    "ray": {"ray": RAY},
    "default": {"default": DEFAULT},
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(run: Path, without: frozenset[str] = frozenset()) -> dict[str, str]:
    """sha256 of each metrics row (timing fields and `without` aside) and of each
    checkpoint's weights."""
    found = {}
    for i, line in enumerate((run / "metrics.jsonl").read_text().splitlines()):
        row = {k: v for k, v in json.loads(line).items() if k not in TIMING | without}
        text = json.dumps(row, sort_keys=True).encode()
        found[f"metrics[{i}] step {row.get('step')}"] = _sha(text)
    for path in sorted(run.glob("checkpoint-*/**/*.safetensors")):
        found[str(path.relative_to(run))] = _sha(path.read_bytes())
    return found


def train(args: list[str], where: Path) -> Path:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(["tests", os.environ.get("PYTHONPATH", "")]))
    out = where / "run"
    cmd = [sys.executable, "-m", "agentgym", "train", *args, "--set", f"run.output={out}"]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return out


def compare(a: Path, b: Path) -> int:
    left, right = json.loads(a.read_text()), json.loads(b.read_text())
    differ = sorted(k for k in left.keys() | right.keys() if left.get(k) != right.get(k))
    for key in differ:
        print(f"differs: {key}")
    print(f"{len(left.keys() | right.keys()) - len(differ)} entries equal, {len(differ)} differ")
    return 1 if differ else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", nargs="?", choices=sorted(RUNS), default="tiny")
    parser.add_argument("--out", type=Path, help="where to write the JSON (default: stdout)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    parser.add_argument(
        "--without",
        default="",
        help="metrics left out of the rows' digests, comma-separated: the ones a change "
        "adds (the rest of each row, and every weight, must still match)",
    )
    args = parser.parse_args()
    without = frozenset(filter(None, args.without.split(",")))
    if args.compare:
        sys.exit(compare(*args.compare))
    digests = {}
    for name, run_args in RUNS[args.which].items():
        with tempfile.TemporaryDirectory(prefix=f"same-run-{name}-") as tmp:
            run = train(run_args, Path(tmp))
            digests |= {f"{name}: {k}": v for k, v in digest(run, without).items()}
    text = json.dumps(digests, indent=1, sort_keys=True)
    if args.out:
        args.out.write_text(text + "\n")
    print(f"{len(digests)} digests" + (f" -> {args.out}" if args.out else ""))
    if not args.out:
        print(text)


if __name__ == "__main__":
    main()
