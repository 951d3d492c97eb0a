"""Two learner steps on a fixed batch, in one process or under torchrun; saves what they gave.

`python -m torch.distributed.run --nproc-per-node 2 tests/distributed_step.py CASES OUT`
writes OUT/case{i}-rank{r}.pt on each rank for each case: the gradient of the
batch's loss, two steps' metrics and the trained weights after them.
`run(overrides)` does the same in the calling process.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from agentgym.config import load_config  # noqa: E402
from agentgym.learn.learner import Learner  # noqa: E402
from agentgym.policy.models import load_model_and_tokenizer  # noqa: E402
from agentgym.scale import ranks  # noqa: E402
from agentgym.types import Batch  # noqa: E402

ROWS = 7
"""Odd, so that no number of ranks or micro-batch size divides it into equal shares."""


def fixed_batch(vocab: int, rows: int = ROWS, length: int = 40, shared: int = 20) -> Batch:
    """Rows sharing a 20-token prompt (the learner runs it once), of different lengths,
    with two turns under the loss mask and a different advantage each."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, vocab, (rows, length), generator=g)
    ids[:, :shared] = ids[0, :shared]
    attention = torch.ones(rows, length, dtype=torch.long)
    mask = torch.zeros(rows, length - 1)
    mask[:, shared + 2 : shared + 8] = 1.0
    mask[:, shared + 12 :] = 1.0
    for row in range(rows):
        cut = 3 * row  # right padding: each row a different length
        if cut:
            attention[row, -cut:] = 0
            mask[row, -cut:] = 0.0
    old = (-torch.rand(rows, length - 1, generator=g) - 1.0) * mask
    advantages = torch.linspace(-1.0, 1.5, rows)
    return Batch(ids, attention, mask, old, advantages)


def run(overrides: dict, follow: str | None = None) -> dict:
    """A learner on tiny-random: the gradient `accumulate` gives, then two steps on
    `fixed_batch`; returns the gradient, the steps' metrics and the trained weights.

    `follow` plays a training run's protocol instead (see `_followed`).
    """
    # eps 1e-6, not AdamW's 1e-8: AdamW divides each gradient entry by its own size plus eps,
    # so the ~1e-9 that float order moves an entry near 1e-8 would move its weight by up to
    # lr * 1e-9 / eps, the tests' whole tolerance at the default
    base = {"optim.lr": 1e-5, "optim.adam_epsilon": 1e-6, "grpo.beta": 0.04}
    config = load_config(overrides={**base, **overrides})
    model, tokenizer = load_model_and_tokenizer("tiny-random")
    # bench/gpu_check.sh runs the cases on a GPU: each rank's (`ranks.device`), or the one named
    on = os.environ.get("AGENTGYM_CHECK_DEVICE")
    if on is not None:
        model = model.to(ranks.device() if ranks.active() else torch.device(on))
    batch = fixed_batch(len(tokenizer))

    def make() -> Learner:
        torch.manual_seed(0)  # LoRA's initial adapters
        return Learner(model, config)

    if follow is not None:
        return _followed(make, batch, follow)
    learner = make()
    grads = _gradient(learner, batch)
    metrics = [learner.step(batch) for _ in range(2)]
    runner = type(learner._run).__name__  # what runs the model's passes (FSDP's is _Root)
    return {"grads": grads, "metrics": metrics, "steps": 2, "weights": _weights(learner),
            "runner": runner}  # fmt: skip


def _followed(make, batch: Batch, how: str) -> dict:
    """Rank 0 leads as `train` does: builds its learner (`ranks.build_learner`) and shares
    two steps (`ranks.share_step`), or with `how` "release" releases the others at once;
    the other ranks run `ranks.follow`."""
    built: list[Learner] = []

    def build() -> Learner:
        built.append(make())
        return built[-1]

    if not ranks.is_main():
        steps = ranks.follow(build)
        weights = _weights(built[0]) if built else {}
        return {"metrics": [], "steps": steps, "built": len(built), "weights": weights}
    if how == "release":
        ranks.release_followers()
        return {"metrics": [], "steps": 0, "built": 0, "weights": {}}
    learner = ranks.build_learner(build)
    metrics = [ranks.share_step(learner, batch) for _ in range(2)]
    ranks.release_followers()
    return {"metrics": metrics, "steps": 2, "built": len(built), "weights": _weights(learner)}


def _weights(learner: Learner) -> dict[str, torch.Tensor]:
    return {name: w.clone().cpu() for name, w in learner.named_weights()}


def _gradient(learner: Learner, batch: Batch) -> dict[str, torch.Tensor]:
    learner.accumulate(batch)
    grads = {}
    for name, p in learner.model.named_parameters():
        if p.grad is not None:
            grad = p.grad.full_tensor() if learner.sharded else p.grad
            grads[name] = grad.clone().cpu()
    learner.optimizer.zero_grad(set_to_none=True)
    return grads


def main(argv: list[str]) -> None:
    """Runs each case of the JSON list argv[0] ({"overrides": {...}, "follow": None});
    writes argv[1]/case{i}-rank{r}.pt."""
    cases, out = json.loads(argv[0]), Path(argv[1])
    ranks.init()
    try:
        for i, case in enumerate(cases):
            result = run(case["overrides"], case.get("follow"))
            torch.save({**result, "world_size": ranks.world_size()},
                       out / f"case{i}-rank{ranks.rank()}.pt")  # fmt: skip
    finally:
        ranks.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
