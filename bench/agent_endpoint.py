"""Sampled tokens per second of an agent program through the endpoint (`run.agent`) against
the in-process rollout, on the same `tool_call` tasks and G, with the embedded model. A
benchmark, not a test.

Both sides play the same episodes: the agent answers every turn with the environment's own
reply (`AgentTask.env_step`), as the rollout does, so the conversations have the same
shape; only the path differs (HTTP requests to the in-process server, the engine's batching
of requests as they arrive, against one `generate` call per turn over every live episode).
The two alternate for `--rounds` rounds on fresh tasks; the figure is the sampled tokens
over the wall time of each side's rounds, and the ratio endpoint / in-process (aim: 0.8 or
more).

    python bench/agent_endpoint.py [--tasks 4] [--group 4] [--rounds 2] [--model embedded]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--tasks", type=int, default=4, help="tasks per round")
    parser.add_argument("--group", type=int, default=4, help="G, episodes per task")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()

    import torch

    from agentgym.env.core import make_env
    from agentgym.policy.base import SamplingParams
    from agentgym.policy.hf import HFPolicy
    from agentgym.policy.models import load_model_and_tokenizer
    from agentgym.rollout.player import Submission, TurnPlayer
    from agentgym.serve.agents import AgentPlayer, load_agent
    from agentgym.types import TaskSpec

    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(args.model)
    policy = HFPolicy(model, tokenizer)
    player = AgentPlayer(
        load_agent("agents:as_the_rollout"),
        tokenizer,
        concurrency=args.tasks * args.group,
        timeout_s=24 * 3600,
    )
    envs = [make_env("tool_call") for _ in range(args.tasks * args.group)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0)
    sides = {"in-process rollout": TurnPlayer(tokenizer), "agent through the endpoint": player}
    tokens = dict.fromkeys(sides, 0)
    seconds = dict.fromkeys(sides, 0.0)
    try:
        for side in sides.values():  # warm-up, not counted: first calls pay one-off costs
            warm = tuple(TaskSpec(seed=10**6 + t) for t in range(args.tasks))
            side.play(policy, envs, Submission(warm, args.group, params, 4096))
        for r in range(args.rounds):
            specs = tuple(TaskSpec(seed=1000 * r + t) for t in range(args.tasks))
            order = list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]
            for name, side in order:
                start = time.perf_counter()
                played = side.play(policy, envs, Submission(specs, args.group, params, 4096))
                seconds[name] += time.perf_counter() - start
                tokens[name] += sum(t.completion_length for t in played)
                errors = [t.error for t in played if t.error]
                assert not errors, errors[:3]
    finally:
        player.close()
    rates = {name: tokens[name] / seconds[name] for name in sides}
    print(f"{args.model}, tool_call, {args.tasks} tasks x G={args.group}, {args.rounds} rounds")
    for name in sides:
        figures = f"{tokens[name]:6d} tokens  {seconds[name]:7.1f} s  {rates[name]:7.1f} tok/s"
        print(f"  {name:28s} {figures}")
    batches = player.engine.batches
    print(
        f"  endpoint generate calls: {len(batches)}, mean batch {sum(batches) / len(batches):.1f}"
    )
    ratio = rates["agent through the endpoint"] / rates["in-process rollout"]
    print(f"  ratio endpoint / in-process: {ratio:.2f} (aim: >= 0.8)")


if __name__ == "__main__":
    main()
