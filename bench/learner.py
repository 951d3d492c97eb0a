"""Benchmark: one GRPO optimizer step on an identical batch, agentgym's learner vs TRL's.

The batch is B x G trajectories: one shared prompt of `--prompt` tokens (a
system prompt with tool schemas is about 300) and completions of lognormal
lengths, with advantages and old logprobs. Both sides train LoRA adapters
(r = 16 on every linear layer) with the reference policy being the adapters
switched off, and take one AdamW step:

- TRL: `GRPOTrainer` with `loss_type="grpo"`, `beta` > 0: the reference
  logprobs (`_get_per_token_logps_and_entropies` with the adapters off, as its
  `_generate_and_score_completions` does), then `compute_loss` and backward
  per micro-batch of `--micro` rows, then the optimizer step.
- agentgym padded: `Learner.step` on the same rows (reference, loss and backward per
  micro-batch, the shared prompt run once per step, rows grouped by length).

- agentgym packed: the same with `optim.micro_batch_tokens` (the padding-free
  learner: rows packed into one sequence, micro-batches cut by a token budget).

The sides alternate, `--repeats` times each after a warm-up; the medians,
their ratios to TRL's, the first-step losses (which must agree), the padding
fraction of the batch, the peak RSS growth of each side (its first two steps
in a fresh process of its own) and our achieved FLOP/s against a matmul peak
measured here are printed. Needs `trl` (the `dev` extra).

    python bench/learner.py                         # embedded SmolLM2-135M
    python bench/learner.py --model tiny-random --repeats 5
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

from agentgym.config import load_config
from agentgym.learn.learner import Learner
from agentgym.policy.models import load_model_and_tokenizer, resolve_model_name
from agentgym.types import Batch


def make_batch(vocab: int, rows: int, prompt: int, mean_len: float, seed: int):
    """Prompt ids [1, P], completions [N, C] right-padded, their mask, advantages, old logprobs."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(mean_len), 0.6, rows).astype(int), 4, 4 * mean_len)
    width = int(lengths.max())
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, vocab, (1, prompt), generator=g)
    completion = torch.randint(3, vocab, (rows, width), generator=g)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    advantages = torch.randn(rows, generator=g)
    old = -torch.rand(rows, width, generator=g) * 3 * mask
    return prompt_ids, completion, mask, advantages, old


def ours_batch(prompt_ids, completion, mask, advantages, old) -> Batch:
    rows, prompt = completion.shape[0], prompt_ids.shape[1]
    ids = torch.cat([prompt_ids.expand(rows, -1), completion], dim=1)
    attention = torch.cat([torch.ones(rows, prompt, dtype=torch.long), mask], dim=1)
    loss_mask = torch.zeros(rows, ids.shape[1] - 1)
    loss_mask[:, prompt - 1 :] = mask.float()
    old_full = torch.zeros_like(loss_mask)
    old_full[:, prompt - 1 :] = old
    return Batch(ids, attention, loss_mask, old_full, advantages)


def matmul_peak(seconds: float = 2.0) -> float:
    """FLOP/s of a large fp32 matmul on this machine, the best of a few runs."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        a @ b
        best = max(best, 2 * 2048**3 / (time.perf_counter() - start))
    return best


class TRLSide:
    def __init__(self, model, tokenizer, args, config):
        from datasets import Dataset
        from peft import LoraConfig
        from trl import GRPOConfig, GRPOTrainer

        self.tmp = tempfile.TemporaryDirectory()
        trl_args = GRPOConfig(
            output_dir=self.tmp.name, per_device_train_batch_size=args.tasks * args.group,
            num_generations=args.group, max_completion_length=args.mean_len * 4,
            beta=config.grpo.beta, epsilon=config.grpo.epsilon, loss_type="grpo",
            learning_rate=config.optim.lr, report_to=[], use_cpu=args.device == "cpu",
            bf16=False,
            temperature=1.0, gradient_accumulation_steps=1, use_bias_correction_kl=False,
        )  # fmt: skip
        lora = LoraConfig(r=config.lora.r, lora_alpha=config.lora.alpha,
                          target_modules="all-linear", task_type="CAUSAL_LM")  # fmt: skip
        self.trainer = GRPOTrainer(
            model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=trl_args, train_dataset=Dataset.from_dict({"prompt": ["x"] * args.group}),
            processing_class=tokenizer, peft_config=lora,
        )  # fmt: skip
        self.trainer.create_optimizer()
        self.micro = args.micro

    def step(self, prompt_ids, completion, mask, advantages, old) -> float:
        t = self.trainer
        model = t.model
        rows = completion.shape[0]
        prompt = prompt_ids.expand(rows, -1)
        ids = torch.cat([prompt, completion], dim=1)
        attention = torch.cat([torch.ones_like(prompt), mask], dim=1)
        with torch.no_grad(), model.disable_adapter():
            ref, _, _ = t._get_per_token_logps_and_entropies(
                model, ids, attention, completion.shape[1], batch_size=self.micro
            )
        t.optimizer.zero_grad()
        total = 0.0
        for s in range(0, rows, self.micro):
            sl = slice(s, s + self.micro)
            inputs = {
                "prompt_ids": prompt[sl], "prompt_mask": torch.ones_like(prompt[sl]),
                "completion_ids": completion[sl], "completion_mask": mask[sl],
                "advantages": advantages[sl], "old_per_token_logps": old[sl],
                "ref_per_token_logps": ref[sl], "num_items_in_batch": mask.sum(),
            }  # fmt: skip
            t.current_gradient_accumulation_steps = (rows + self.micro - 1) // self.micro
            loss = t._compute_loss(model, inputs)
            loss.backward()
            total += float(loss.detach())
        t.optimizer.step()
        return total


def timed(fn) -> tuple[float, float, float]:
    """(seconds, result, peak RSS growth in GB) of one call: the process's peak resident set
    (VmHWM, reset first through /proc/self/clear_refs) less its resident set before."""
    _reset_peak()
    before = _status_kb("VmRSS")
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    return seconds, result, (_status_kb("VmHWM") - before) / 1e6


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # Linux: resets the peak resident set size (VmHWM) to the current one


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(f"{field}:"))
    return int(line.split()[1])


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="embedded (default), tiny-random, a path")
    parser.add_argument("--tasks", type=int, default=2, help="B")
    parser.add_argument("--group", type=int, default=8, help="G")
    parser.add_argument("--prompt", type=int, default=300, help="shared prompt tokens")
    parser.add_argument("--mean-len", type=int, default=96, help="median completion tokens")
    parser.add_argument("--micro", type=int, default=4, help="rows per forward/backward")
    parser.add_argument(
        "--micro-tokens",
        type=int,
        default=None,
        help="the packed side's optim.micro_batch_tokens; default --micro x the longest "
        "completion's tokens (what a padded micro-batch of the longest rows holds)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (bench/gpu_check.sh)")
    parser.add_argument("--memory-of", choices=SIDES, help=argparse.SUPPRESS)
    return parser.parse_args()


SIDES = ("padded", "packed", "trl")


def _sides(args: argparse.Namespace, model, tokenizer, data, names=SIDES) -> dict:
    """Each side's one-step function (returning its loss), built on its own copy of `model`."""
    base = {
        "lora.enabled": True, "lora.r": 16, "lora.alpha": 32, "grpo.beta": 0.04,
        "optim.lr": 1e-5, "optim.micro_batch_size": args.micro, "grpo.loss": "grpo",
    }  # fmt: skip
    budget = packed_budget(args, data)
    batch = ours_batch(*data)
    sides = {}
    for name in names:
        torch.manual_seed(0)  # LoRA's A from the same draw on every side
        if name == "trl":
            trl = TRLSide(copy.deepcopy(model), tokenizer, args, load_config(overrides=base))
            on = [t.to(args.device) for t in data]
            sides[name] = lambda trl=trl, on=on: trl.step(*on)
            continue
        packed = {"optim.micro_batch_tokens": budget} if name == "packed" else {}
        config = load_config(overrides={**base, **packed})
        learner = Learner(copy.deepcopy(model).to(args.device), config)

        def step(learner=learner) -> float:
            stats = learner.step(batch)
            return stats["loss/policy"] + learner.beta * stats["kl"]

        sides[name] = step
    return sides


def packed_budget(args: argparse.Namespace, data) -> int:
    """The packed side's token budget: `--micro-tokens`, else `--micro` x the longest row."""
    return args.micro_tokens or args.micro * int(data[2].sum(dim=1).max())


def _peak_growth(args: argparse.Namespace, side: str) -> float:
    """Peak RSS growth (GB) of `side`'s first two steps, in a fresh process of its own."""
    argv = [sys.executable, __file__, "--memory-of", side]
    keys = ("model", "tasks", "group", "prompt", "mean_len", "micro", "micro_tokens", "device")
    for key in keys:
        if getattr(args, key) is not None:
            argv += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    args = _arguments()
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(args.model)
    rows = args.tasks * args.group
    data = make_batch(len(tokenizer), rows, args.prompt, args.mean_len, seed=0)
    if args.memory_of is not None:  # a child of `_peak_growth`
        fn = _sides(args, model, tokenizer, data, [args.memory_of])[args.memory_of]
        grown = max(timed(fn)[2], timed(fn)[2])
        on_gpu = args.device.startswith("cuda")
        print(torch.cuda.max_memory_allocated() / 1e9 if on_gpu else grown)
        return
    sides = _sides(args, model, tokenizer, data)
    padding = 1 - float(data[2].sum()) / data[2].numel()
    # The warm-up steps start from the same weights (LoRA's B is 0): their losses must agree.
    losses = {name: timed(fn)[1] for name, fn in sides.items()}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, fn in sides.items():
            times[name].append(timed(fn)[0])
    median = {name: statistics.median(t) for name, t in times.items()}
    peaks = {name: _peak_growth(args, name) for name in sides}
    tokens = int(data[2].sum())
    # forward of the reference, forward and backward of the policy: about 4 forwards' matmuls
    params = sum(p.numel() for p in model.parameters())
    processed = args.prompt + tokens  # the shared prompt runs once per step on our side
    flops = 4 * 2 * params * processed
    peak = matmul_peak()
    budget = packed_budget(args, data)
    print(f"model {resolve_model_name(args.model)}: B={args.tasks} x G={args.group}, "
          f"prompt {args.prompt}, completions {tokens} tokens (median {args.mean_len}), "
          f"padding {padding:.1%} of the completion block; padded micro-batches of "
          f"{args.micro} rows, packed ones of at most {budget} tokens"
          )  # fmt: skip
    memory = "peak GPU" if args.device.startswith("cuda") else "peak RSS +"
    print(f"{'side':<22}{'median step':>12}{'vs TRL':>8}{'first-step loss':>18}{memory:>12}")
    labels = {"padded": "agentgym padded", "packed": "agentgym packed", "trl": "TRL GRPOTrainer"}
    for name in sides:
        print(f"{labels[name]:<22}{median[name]:>10.2f} s{median[name] / median['trl']:>7.2f}x"
              f"{losses[name]:>+18.6f}{peaks[name]:>9.2f} GB")  # fmt: skip
    print(f"packed / padded step: {median['packed'] / median['padded']:.2f}x")
    achieved = flops / median["packed"]
    print(f"agentgym packed achieved {achieved / 1e9:.1f} GFLOP/s of a measured matmul peak "
          f"{peak / 1e9:.1f} GFLOP/s ({achieved / peak:.0%})")  # fmt: skip


if __name__ == "__main__":
    main()
