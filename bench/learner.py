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
- agentgym: `Learner.step` on the same rows (reference, loss and backward per
  micro-batch, the shared prompt run once per step, rows grouped by length).

The sides alternate, `--repeats` times each after a warm-up; the medians,
their ratio, both losses (which must agree), the padding fraction of the
batch, the peak RSS growth of each side and our achieved FLOP/s against a
matmul peak measured here are printed. Needs `trl` (the `dev` extra).

    python bench/learner.py                         # embedded SmolLM2-135M
    python bench/learner.py --model tiny-random --repeats 5
"""

from __future__ import annotations

import argparse
import copy
import resource
import statistics
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
            learning_rate=config.optim.lr, report_to=[], use_cpu=True, bf16=False,
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
    """(seconds, result, peak RSS growth in GB) of one call."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1e6
    return seconds, result, grown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="embedded (default), tiny-random, a path")
    parser.add_argument("--tasks", type=int, default=2, help="B")
    parser.add_argument("--group", type=int, default=8, help="G")
    parser.add_argument("--prompt", type=int, default=300, help="shared prompt tokens")
    parser.add_argument("--mean-len", type=int, default=96, help="median completion tokens")
    parser.add_argument("--micro", type=int, default=4, help="rows per forward/backward")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(args.model)
    config = load_config(overrides={
        "lora.enabled": True, "lora.r": 16, "lora.alpha": 32, "grpo.beta": 0.04,
        "optim.lr": 1e-5, "optim.micro_batch_size": args.micro, "grpo.loss": "grpo",
    })  # fmt: skip
    rows = args.tasks * args.group
    data = make_batch(len(tokenizer), rows, args.prompt, args.mean_len, seed=0)
    batch = ours_batch(*data)
    learner = Learner(copy.deepcopy(model), config)
    trl = TRLSide(copy.deepcopy(model), tokenizer, args, config)
    padding = 1 - float(data[2].sum()) / data[2].numel()

    def ours() -> float:
        stats = learner.step(batch)
        return stats["loss/policy"] + learner.beta * stats["kl"]

    # The warm-up steps start from the same weights (LoRA's B is 0): their losses must agree.
    peaks: dict[str, float] = {}
    _, first_ours, peaks["agentgym"] = timed(ours)
    _, first_trl, peaks["trl"] = timed(lambda: trl.step(*data))
    losses = {"agentgym": first_ours, "trl": first_trl}
    times: dict[str, list[float]] = {"agentgym": [], "trl": []}
    for _ in range(args.repeats):
        for name, fn in (("agentgym", ours), ("trl", lambda: trl.step(*data))):
            seconds, _, grown = timed(fn)
            times[name].append(seconds)
            peaks[name] = max(peaks[name], grown)
    ours_s, trl_s = statistics.median(times["agentgym"]), statistics.median(times["trl"])
    tokens = int(data[2].sum())
    # forward of the reference, forward and backward of the policy: about 4 forwards' matmuls
    params = sum(p.numel() for p in model.parameters())
    processed = args.prompt + tokens  # the shared prompt runs once per step on our side
    flops = 4 * 2 * params * processed
    peak = matmul_peak()
    print(f"model {resolve_model_name(args.model)}: B={args.tasks} x G={args.group}, "
          f"prompt {args.prompt}, completions {tokens} tokens (median {args.mean_len}), "
          f"padding {padding:.1%} of the completion block, micro-batches of {args.micro}"
          )  # fmt: skip
    print(f"agentgym step: median {ours_s:.2f} s   TRL step: median {trl_s:.2f} s   "
          f"ratio {ours_s / trl_s:.2f}x")  # fmt: skip
    print(f"first-step loss: agentgym {losses['agentgym']:+.6f}   TRL {losses['trl']:+.6f}")
    print(f"peak RSS growth (the process's high-water mark, agentgym's side first): "
          f"agentgym {peaks['agentgym']:.2f} GB   TRL {peaks['trl']:.2f} GB")  # fmt: skip
    print(f"agentgym achieved {flops / ours_s / 1e9:.1f} GFLOP/s of a measured matmul peak "
          f"{peak / 1e9:.1f} GFLOP/s ({flops / ours_s / peak:.0%})")  # fmt: skip


if __name__ == "__main__":
    main()
