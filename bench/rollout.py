"""Benchmark: tokens/s of agentgym's batched multi-turn rollout, with the transformers and
the vLLM backends, vs the tutorial's loop.

The peer is the seed tutorial's rollout (section 6): one `model.generate` per
prompt with the prompt repeated G times (`output_scores=True`, logprobs taken
from the scores). It plays the same tasks with the same G through the same
environments, one task group at a time. agentgym batches every live episode of
all B tasks into one `generate` per turn, with its own KV-cached sampling loop
(`HFPolicy`) or a vLLM engine (`VLLMPolicy`, started from the same weights, its
start-up not timed). All are measured in this run, on this machine; the ratios
are printed. The vLLM backend needs vLLM: run it from .venv-vllm on CPU
(`make setup-vllm`), or with `pip install -e ".[vllm]"` on a GPU.

The vLLM CPU build pins transformers below 5.20, whose SDPA path copies the
keys and values of every grouped-query head at each decoded token (`repeat_kv`);
5.24, in .venv, attends on the shared heads instead (`pack_gqa`), which makes
the transformers sampler about twice as fast. So that vLLM is compared with the
best transformers sampler, `--peer-python` measures the `--peer-backends` in this
run with another interpreter (this script, run by it), and the ratios use those.

    .venv-vllm/bin/python bench/rollout.py --peer-python .venv/bin/python   # embedded SmolLM2-135M
    python bench/rollout.py --backends hf,tutorial --model tiny-random --env math --tasks 2

`hf-continuous` and `hf-ordered` are the transformers sampler with continuous batching over
turns (`run.turn_batching`): an episode's next turn joins the running decode batch as soon
as its tool replied, instead of every turn waiting for all episodes' previous one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time

import gymnasium as gym
import torch
import transformers

from agentgym.env.core import make_env
from agentgym.policy.base import Generation, SamplingParams
from agentgym.policy.hf import HFPolicy, stop_token_ids
from agentgym.policy.models import load_model_and_tokenizer, resolve_model_name
from agentgym.policy.vllm import VLLMPolicy, save_model_folder
from agentgym.rollout.episodes import TaskSpec, collect


class TutorialLoopPolicy:
    """The tutorial's sampler: `model.generate` with scores, for one group of G at a time."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.stop_ids = stop_token_ids(model, tokenizer)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams, streams=None
                 ) -> list[Generation]:  # fmt: skip
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        on = self.model.device
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=on)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=on)
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True,
            temperature=params.temperature, top_p=params.top_p, top_k=0,
            max_new_tokens=params.max_new_tokens, pad_token_id=pad,
            eos_token_id=sorted(self.stop_ids), output_scores=True, return_dict_in_generate=True,
        )  # fmt: skip
        new = out.sequences[:, width:]
        scores = torch.stack(out.scores, dim=1).float().log_softmax(-1)
        logps = scores.gather(-1, new[..., None]).squeeze(-1)
        gens = []
        for row, lp in zip(new.tolist(), logps.tolist(), strict=True):
            end = next((k for k, t in enumerate(row) if t in self.stop_ids), None)
            cut = len(row) if end is None else end + 1
            reason = "length" if end is None else "stop"
            gens.append(Generation(tuple(row[:cut]), tuple(lp[:cut]), reason))
        return gens


class SlowTool(gym.Wrapper):
    """The environment's `step` after waiting `latency_s`, as a remote tool's round trip."""

    def __init__(self, env: gym.Env, latency_s: float):
        super().__init__(env)
        self.latency_s = latency_s

    def step(self, action):
        time.sleep(self.latency_s)
        return self.env.step(action)


def sampled_tokens(trajectories) -> int:
    return sum(t.completion_length for t in trajectories)


LABELS = {
    "hf": "agentgym batched, transformers",
    "hf-continuous": "agentgym continuous, transformers",
    "hf-ordered": "agentgym ordered, transformers",
    "vllm": "agentgym batched, vLLM",
    "tutorial": "tutorial per-prompt loop",
}


def vllm_policy(model, tokenizer, args) -> VLLMPolicy:
    """An engine started from the benchmark's model, float32 on CPU as the others."""
    return VLLMPolicy(save_model_folder(model, tokenizer), owns_folder=True,
                      stop_ids=stop_token_ids(model, tokenizer),
                      max_model_len=args.max_episode_tokens + args.max_new_tokens)  # fmt: skip


def timed_rollout(name, policy, envs, specs, g, tokenizer, params, max_tokens):
    """Plays the tasks with `policy`; returns (trajectories, seconds). The tutorial's
    loop plays one task group at a time, as the tutorial does; the others all at once."""
    start = time.perf_counter()
    if name == "tutorial":
        out = []
        for spec in specs:
            out += collect(envs[:g], [spec], g, policy, tokenizer, params, max_tokens=max_tokens)
    else:  # hf-continuous, hf-ordered: run.turn_batching
        turns = name.partition("-")[2] or "barrier"
        out = collect(envs, specs, g, policy, tokenizer, params, max_tokens=max_tokens,
                      turn_batching=turns)  # fmt: skip
    return out, time.perf_counter() - start


def run(args) -> None:
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(args.model)
    model = model.to(args.device).eval()
    g, b = args.group_size, args.tasks
    envs = [make_env(args.env) for _ in range(b * g)]
    if args.tool_latency_ms:
        envs = [SlowTool(env, args.tool_latency_ms / 1000) for env in envs]
    specs = [TaskSpec(seed=1000 + i) for i in range(b)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0)
    backends = args.backends.split(",")
    unknown = set(backends) - set(LABELS)
    if unknown:
        raise SystemExit(f"--backends: unknown {sorted(unknown)}; choose from {list(LABELS)}")
    makers = {
        "hf": lambda: HFPolicy(model, tokenizer),
        "hf-continuous": lambda: HFPolicy(model, tokenizer),
        "hf-ordered": lambda: HFPolicy(model, tokenizer),
        "vllm": lambda: vllm_policy(model, tokenizer, args),
        "tutorial": lambda: TutorialLoopPolicy(model, tokenizer),
    }
    latency = f" (each step {args.tool_latency_ms:g} ms late)" if args.tool_latency_ms else ""
    print(f"model {resolve_model_name(args.model)}, env {args.env}{latency}, B={b} tasks x G={g}, "
          f"max_new_tokens={args.max_new_tokens}, torch threads {torch.get_num_threads()}, "
          f"transformers {transformers.__version__}", flush=True)  # fmt: skip
    rate = {}
    warm = [tokenizer.encode("warm up")] * g
    for name in backends:  # each line as soon as it is measured: the slowest comes last
        policy = makers[name]()
        # first calls pay one-time costs; keep them out of the timing
        policy.generate(warm, SamplingParams(max_new_tokens=8, seed=0))
        played, seconds = timed_rollout(name, policy, envs, specs, g, tokenizer, params,
                                        args.max_episode_tokens)  # fmt: skip
        if hasattr(policy, "close"):
            policy.close()
        tokens, turns = sampled_tokens(played), sum(len(t.turns) for t in played) / len(played)
        rate[name] = tokens / seconds
        print(f"{LABELS[name]:31s}: {tokens:6d} tokens in {seconds:7.1f} s "
              f"= {rate[name]:7.1f} tokens/s ({turns:.1f} turns/episode)", flush=True)  # fmt: skip
    if args.json:
        print(json.dumps({"rate": rate, "transformers": transformers.__version__}))
        return
    if args.peer_python:
        rate.update(peer_rates(args))
    pairs = [(a, "tutorial") for a in ("hf", "hf-continuous", "hf-ordered")]
    pairs += [(a, "hf") for a in ("hf-continuous", "hf-ordered")]
    for a, b_ in (*pairs, ("vllm", "hf"), ("vllm", "tutorial")):
        if a in rate and b_ in rate:
            print(f"ratio ({LABELS[a]} / {LABELS[b_]}): {rate[a] / rate[b_]:.2f}x")


def peer_rates(args) -> dict[str, float]:
    """The `--peer-backends`' tokens/s, measured now by this script under `--peer-python`;
    they replace this interpreter's figures for the same backends in the ratios."""
    command = [args.peer_python, __file__, "--json", "--backends", args.peer_backends,
               "--env", args.env, "--tasks", str(args.tasks), "--group-size",
               str(args.group_size), "--max-new-tokens", str(args.max_new_tokens),
               "--max-episode-tokens", str(args.max_episode_tokens),
               "--tool-latency-ms", str(args.tool_latency_ms),
               "--device", args.device]  # fmt: skip
    if args.model:
        command += ["--model", args.model]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"--peer-python {args.peer_python} failed:\n{done.stderr[-2000:]}")
    peer = json.loads(done.stdout.strip().splitlines()[-1])
    for name, value in peer["rate"].items():
        version = peer["transformers"]
        print(f"{LABELS[name]:31s}: {value:7.1f} tokens/s under {args.peer_python} "
              f"(transformers {version}); the ratios use this", flush=True)  # fmt: skip
    return peer["rate"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M")
    parser.add_argument("--env", default="tool_call")
    parser.add_argument("--tasks", type=int, default=8, help="B")
    parser.add_argument("--group-size", type=int, default=4, help="G")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--max-episode-tokens", type=int, default=2048)
    parser.add_argument("--tool-latency-ms", type=float, default=0.0,
                        help="each env.step waits this long first (a remote tool)")  # fmt: skip
    parser.add_argument("--backends", default="hf,vllm,tutorial",
                        help="comma-separated, from: " + ", ".join(LABELS))  # fmt: skip
    parser.add_argument("--peer-python", default=None,
                        help="another interpreter (e.g. .venv/bin/python) that measures "
                        "--peer-backends in this run; the ratios use its figures")  # fmt: skip
    parser.add_argument("--peer-backends", default="hf,tutorial")
    parser.add_argument("--json", action="store_true", help="print the rates as one JSON line")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (bench/gpu_check.sh)")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
