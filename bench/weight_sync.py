"""Benchmark: seconds of one weight sync into a vLLM engine (`VLLMPolicy.load_weights`,
the full weights of the model), by route.

- file: the route before issue 21, kept here for comparison: every tensor copied to the
  CPU, written to one safetensors file in /dev/shm, which the worker reads back
  (`safetensors.load_file`) and loads.
- shared: today's route to an engine in its own process (`policy.engine_process:
  separate`, the default on CPU): one shared-memory block, mapped by the worker.
- in_process: today's route to an engine in this process (`engine_process:
  in_process`): the tensors themselves. Measured last, in a new engine, since on CPU
  such an engine cuts this process's torch threads to 1.

The file and shared routes alternate on one engine, so a busy machine slows both
alike; each sync is followed by a prefix-cache reset, as in `load_weights`. Engine
start-up is not timed. Needs vLLM (on CPU, .venv-vllm):

    .venv-vllm/bin/python bench/weight_sync.py                 # embedded SmolLM2-135M
    .venv-vllm/bin/python bench/weight_sync.py --repeats 9 --routes file,shared
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
from safetensors.torch import save_file

from agentgym.policy.hf import stop_token_ids
from agentgym.policy.models import load_model_and_tokenizer, resolve_model_name
from agentgym.policy.vllm import VLLMPolicy, save_model_folder

ROUTES = ("file", "shared", "in_process")


def reload_file(worker, path: str) -> int:
    """The worker's half of the file route (sent to it as a callable)."""
    from safetensors.torch import load_file

    return worker.agentgym_reload(list(load_file(path).items()))


def sync_by_file(policy: VLLMPolicy, model) -> None:
    """The file route, as `load_weights` took it before issue 21."""
    tensors = {name: t.detach().to("cpu", copy=True) for name, t in model.named_parameters()}
    with tempfile.TemporaryDirectory(prefix="agentgym-weights-", dir="/dev/shm") as tmp:
        path = os.path.join(tmp, "weights.safetensors")
        save_file(tensors, path)
        policy.llm.collective_rpc(reload_file, args=(path,))
    policy.llm.reset_prefix_cache()


def run(args) -> None:
    routes = args.routes.split(",")
    if set(routes) - set(ROUTES):
        raise SystemExit(f"--routes: unknown {sorted(set(routes) - set(ROUTES))}; from {ROUTES}")
    model, tokenizer = load_model_and_tokenizer(args.model)
    model.eval()
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"model {resolve_model_name(args.model)}: {size / 2**20:.0f} MiB of weights, "
          f"{args.repeats} syncs per route, torch threads {torch.get_num_threads()}",
          flush=True)  # fmt: skip
    # the file route sends the worker a callable, which vLLM's RPC takes only so
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    syncs = {
        "file": lambda policy: sync_by_file(policy, model),
        "shared": lambda policy: policy.load_weights(model.named_parameters()),
        "in_process": lambda policy: policy.load_weights(model.named_parameters()),
    }
    seconds: dict[str, list[float]] = {name: [] for name in routes}
    for in_process, names in ((False, ["file", "shared"]), (True, ["in_process"])):
        names = [name for name in names if name in routes]
        if not names:
            continue
        policy = VLLMPolicy(save_model_folder(model, tokenizer), owns_folder=True,
                            stop_ids=stop_token_ids(model, tokenizer), max_model_len=1024,
                            dtype="float32", in_process=in_process)  # fmt: skip
        for name in names:  # once each, untimed: first calls pay one-time costs
            syncs[name](policy)
        for _ in range(args.repeats):
            for name in names:
                start = time.perf_counter()
                syncs[name](policy)
                seconds[name].append(time.perf_counter() - start)
        policy.close()
    for name in routes:
        runs = ", ".join(f"{s:.2f}" for s in seconds[name])
        print(f"{name:10s}: median {statistics.median(seconds[name]):6.3f} s  ({runs})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--routes", default=",".join(ROUTES),
                        help=f"comma-separated, from: {', '.join(ROUTES)}")  # fmt: skip
    run(parser.parse_args())


if __name__ == "__main__":
    main()
