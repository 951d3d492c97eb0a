"""Which tool-call format does a model write best after SFT: Hermes in the system prompt,
the chat template's native tools (a Qwen2.5-style template), or ReAct? A benchmark, not a test.

For each format, in one run: `agentgym sft` on `tool_call` (calculator tasks, the default
run's SFT settings) from the embedded SmolLM2-135M-Instruct, then 64 sampled episodes (16
held-out test tasks x G=4, temperature 1.0) of the SFT checkpoint.
Printed side by side: the share of well-formed calls (calls without a format error: invalid
JSON, cut off, no name, arguments not an object), calls per episode, the share of groups
whose four rewards are all equal (zero variance: GRPO learns nothing from them), and the
mean reward.

    python bench/tool_formats.py [--steps 12] [--tasks 16] [--out /tmp/tool_formats]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

FORMATS = {
    "hermes (system prompt)": ["--set", "run.env_kwargs.tool_format=hermes"],
    "native (qwen2.5 template)": [
        "--set", "run.env_kwargs.tool_format=native", "--set", "model.chat_template=qwen2.5",
    ],
    "react": ["--set", "run.env_kwargs.tool_format=react"],
}  # fmt: skip
FORMAT_ERRORS = ("invalid_json", "truncated", "missing_name", "arguments_not_object")


def sft(name: str, extra: list[str], out: Path, steps: int) -> Path:
    """Runs `agentgym sft` with the default run's config and `extra`; the checkpoint folder."""
    folder = out / name.split()[0]
    done = sorted(folder.glob("checkpoint-*/COMPLETE"))
    if done:  # a rerun with the same --out samples the checkpoint it already has
        return done[-1].parent
    cmd = [
        sys.executable, "-m", "agentgym", "sft", "--config", "configs/tool_call.yaml",
        "--steps", str(steps), "--output", str(folder), *extra,
    ]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return sorted(folder.glob("checkpoint-*/COMPLETE"))[-1].parent


def sample(checkpoint: Path, extra: list[str], tasks: int, group: int) -> dict[str, float]:
    """Plays `tasks` x `group` episodes of the checkpoint at temperature 1; the figures."""
    from agentgym.config_cli import load
    from agentgym.env.core import make_env
    from agentgym.policy.base import SamplingParams
    from agentgym.policy.hf import HFPolicy
    from agentgym.policy.models import load_configured
    from agentgym.rollout.episodes import TaskSpec, collect

    overrides = [extra[i + 1] for i in range(0, len(extra), 2)]
    config = load(Path("configs/tool_call.yaml"), overrides)
    model, tokenizer = load_configured(str(checkpoint), config.model)
    envs = [make_env(config.run.env, **config.run.env_kwargs) for _ in range(tasks * group)]
    specs = [TaskSpec(task_id=f"calculator/test/{i}", split="test") for i in range(tasks)]
    params = SamplingParams(max_new_tokens=config.sampling.max_new_tokens, temperature=1.0, seed=0)
    trajs = collect(envs, specs, group, HFPolicy(model, tokenizer), tokenizer, params, 640)
    for env in envs:
        env.close()
    calls = sum(t.counts.get("tool_calls", 0) for t in trajs)
    bad = sum(t.counts.get(f"tool_errors/{k}", 0) for k in FORMAT_ERRORS for t in trajs)
    rewards = [[t.reward for t in trajs if t.group == g] for g in range(tasks)]
    return {
        "well_formed_calls": (calls - bad) / calls if calls else float("nan"),
        "calls_per_episode": calls / len(trajs),
        "zero_variance_groups": sum(len(set(r)) == 1 for r in rewards) / tasks,
        "correct": sum(t.reward_parts.get("correctness", 0.0) for t in trajs) / len(trajs),
        "mean_reward": sum(t.reward for t in trajs) / len(trajs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="SFT steps (the default run's)")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("/tmp/agentgym-tool-formats"))
    args = parser.parse_args()
    rows = {}
    for name, extra in FORMATS.items():
        start = time.perf_counter()
        checkpoint = sft(name, extra, args.out, args.steps)
        rows[name] = sample(checkpoint, extra, args.tasks, args.group)
        rows[name]["seconds"] = time.perf_counter() - start
        print(name, json.dumps(rows[name]), flush=True)
    episodes = args.tasks * args.group
    print(f"\nafter {args.steps} SFT steps, {episodes} sampled episodes each (T=1.0):")
    print(f"{'format':28} {'well-formed':>11} {'calls/ep':>9} {'zero-var':>9} {'correct':>8}")
    for name, r in rows.items():
        print(
            f"{name:28} {r['well_formed_calls']:11.3f} {r['calls_per_episode']:9.2f} "
            f"{r['zero_variance_groups']:9.3f} {r['correct']:8.3f}"
        )
    (args.out / "tool_formats.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
