"""Benchmark: rollout throughput on 1 and 2 Ray workers, and the Ray path's overhead.

Four ways play the same B tasks x G episodes with the same sampling seed: the
in-process `collect` (what `distributed.backend: none` runs) with torch's
default threads and with one, and `RayRollout` with 1 and with 2 worker actors
on a local Ray (a lone worker gets every CPU and as many threads, two get one
each). Every episode draws from its own random stream, so all four sample the
same tokens (checked and printed), and the comparison is of time only. Each
round runs the four in turn (workers are started and warmed up outside the
timing); the medians over rounds give sampled tokens/s and the ratios: 2 Ray
workers against 1, 1 Ray worker against the in-process rollout with the same
threads (the Ray path's overhead), and the in-process rollout on 1 thread
against its default, which tells how much of the 2-worker gain is only one
thread per process. Also printed: one weight sync of the whole model through
Ray's object store and through the collective (`distributed.weight_sync:
collective`, gloo here), the step-time cost of `distributed.backend: ray`.

    python bench/scale.py                           # embedded SmolLM2-135M, tool_call env
    python bench/scale.py --model tiny-random --rounds 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from agentgym.config import load_config
from agentgym.env.core import make_env
from agentgym.policy.base import SamplingParams
from agentgym.policy.hf import HFPolicy
from agentgym.policy.models import load_model_and_tokenizer, resolve_model_name
from agentgym.rollout.episodes import TaskSpec, collect
from agentgym.rollout.player import Submission
from agentgym.run.preflight import require_ray
from agentgym.scale.ray_rollout import RayRollout


def sampled_tokens(trajectories) -> int:
    return sum(t.completion_length for t in trajectories)


def run(args) -> None:
    ray = require_ray()
    ray.init(include_dashboard=False, log_to_driver=False)
    model, tokenizer = load_model_and_tokenizer(args.model)
    g, b = args.group_size, args.tasks
    config = load_config(overrides={
        "model.name": args.model, "run.env": args.env, "grpo.group_size": g,
        "grpo.tasks_per_step": b, "distributed.backend": "ray",
    })  # fmt: skip
    envs = [make_env(args.env) for _ in range(b * g)]
    specs = [TaskSpec(seed=1000 + i) for i in range(b)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0)
    warm = SamplingParams(max_new_tokens=4, temperature=1.0, seed=1)
    local = HFPolicy(model, tokenizer)
    collect(envs, specs, g, local, tokenizer, warm)  # one-time costs, outside the timing
    weights = list(model.named_parameters())
    threads = torch.get_num_threads()
    names = ["in-process", "in-process, 1 thread", "ray x1", "ray x2"]
    seconds: dict[str, list[float]] = {name: [] for name in names}
    played, syncs, collective_syncs, sync_path = {}, [], [], ""
    for _ in range(args.rounds):
        for name, n in (("in-process", threads), ("in-process, 1 thread", 1)):
            torch.set_num_threads(n)
            start = time.perf_counter()
            played[name] = collect(envs, specs, g, local, tokenizer, params,
                                   max_tokens=args.max_episode_tokens)  # fmt: skip
            seconds[name].append(time.perf_counter() - start)
        torch.set_num_threads(threads)
        for workers in (1, 2):
            config.distributed.rollout_workers = workers
            rollout = RayRollout(config, args.model, weights)
            try:
                rollout.collect(Submission(tuple(specs), g, warm))
                start = time.perf_counter()
                played[f"ray x{workers}"] = rollout.collect(
                    Submission(tuple(specs), g, params, args.max_episode_tokens)
                )
                seconds[f"ray x{workers}"].append(time.perf_counter() - start)
                if workers == 1:
                    syncs.append(rollout.load_weights(weights))
                    rollout.collective = True  # distributed.weight_sync: collective
                    rollout.load_weights(weights)  # forms the group, outside the timing
                    collective_syncs.append(rollout.load_weights(weights))
                    sync_path = rollout.sync_path
            finally:
                rollout.close()
    ray.shutdown()
    report(args, played, seconds, (syncs, collective_syncs, sync_path),
           sum(p.numel() for _, p in weights), threads)  # fmt: skip


def report(args, played, seconds, sync, parameters: int, threads: int) -> None:
    syncs, collective_syncs, sync_path = sync
    tokens = sampled_tokens(played["in-process"])
    same = all([t.tokens for t in v] == [t.tokens for t in played["in-process"]]
               for v in played.values())  # fmt: skip
    print(f"model {resolve_model_name(args.model)}, env {args.env}, B={args.tasks} tasks x "
          f"G={args.group_size}, max_new_tokens={args.max_new_tokens}, {args.rounds} rounds, "
          f"{os.cpu_count()} CPUs, torch threads here {threads}")  # fmt: skip
    tps = {}
    for name, times in seconds.items():
        median = statistics.median(times)
        tps[name] = tokens / median
        print(f"{name:20s}: {tokens:6d} tokens in {median:7.1f} s (median; "
              f"{min(times):.1f} to {max(times):.1f}) = {tps[name]:7.1f} tokens/s")  # fmt: skip
    print(f"identical trajectories in all four: {'yes' if same else 'NO'}")
    print(f"ratio (2 Ray workers / 1 Ray worker): {tps['ray x2'] / tps['ray x1']:.2f}x tokens/s")
    print(f"ratio (1 Ray worker / in-process):    {tps['ray x1'] / tps['in-process']:.2f}x "
          "tokens/s, the same threads")  # fmt: skip
    print(f"ratio (in-process, 1 thread / {threads} threads): "
          f"{tps['in-process, 1 thread'] / tps['in-process']:.2f}x tokens/s")  # fmt: skip
    store, collective = statistics.median(syncs), statistics.median(collective_syncs)
    print(f"weight sync to 1 worker ({parameters / 1e6:.1f} M parameters): object store "
          f"{store:.2f} s, {sync_path} {collective:.2f} s (medians); ratio "
          f"{collective / store:.2f}x the object store's time")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M")
    parser.add_argument("--env", default="tool_call")
    parser.add_argument("--tasks", type=int, default=4, help="B")
    parser.add_argument("--group-size", type=int, default=4, help="G")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--max-episode-tokens", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
