"""The default run's model leaves its run folder (issue 37): after `make train`, moves the run
folder elsewhere, then loads its `checkpoint-best` in plain transformers and generates, exports
it as adapters (loaded with peft's `AutoPeftModelForCausalLM`) and merged (loaded with
`AutoModelForCausalLM`), and compares their logits with checkpoint-best's. With `--vllm`, in
`.venv-vllm`: vLLM generates greedily from the merged export, against transformers.

Not collected by pytest (it needs a finished default run, about 16 minutes):

    make train   # or: .venv/bin/agentgym train --config configs/tool_call.yaml --output RUN
    .venv/bin/python tests/default_run_travels.py RUN --to /tmp/elsewhere
    .venv-vllm/bin/python tests/default_run_travels.py --vllm /tmp/elsewhere/export-merged
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import torch

PROMPT = [
    {"role": "system", "content": "You are a helpful assistant with a calculator."},
    {"role": "user", "content": "What is 17 * 23? Put the final answer in \\boxed{}."},
]


def _inputs(tokenizer) -> torch.Tensor:
    text = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, return_tensors="pt").input_ids


def _check(name: str, model, tokenizer, reference: torch.Tensor | None) -> torch.Tensor:
    """Greedy 32 tokens from `model`; prints them and the largest logit gap to `reference`."""
    ids = _inputs(tokenizer)
    with torch.no_grad():
        logits = model(ids).logits[0, -1].float()
        out = model.generate(ids, max_new_tokens=32, do_sample=False)
    text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    gap = "" if reference is None else f", max logit gap {(logits - reference).abs().max():.2e}"
    print(f"{name}: {type(model).__name__} generates {text!r}{gap}")
    return logits


def travel(run: Path, to: Path) -> None:
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    to.mkdir(parents=True, exist_ok=True)
    moved = Path(shutil.move(str(run), str(to / run.name)))
    print(f"moved {run} -> {moved} (the old path exists: {run.exists()})")
    best = moved / "checkpoint-best"
    tokenizer = AutoTokenizer.from_pretrained(best)
    model = AutoModelForCausalLM.from_pretrained(best)
    reference = _check("checkpoint-best", model, tokenizer, None)
    agentgym = Path(sys.executable).with_name("agentgym")
    for kind, extra in (("adapters", []), ("merged", ["--merge"])):
        out = to / f"export-{kind}"
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run([agentgym, "export", moved, "--output", out, *extra], check=True)
        loader = AutoPeftModelForCausalLM if kind == "adapters" else AutoModelForCausalLM
        model = loader.from_pretrained(out)
        _check(f"export ({kind})", model, AutoTokenizer.from_pretrained(out), reference)


def with_vllm(merged: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(merged)
    ids = _inputs(tokenizer)[0].tolist()
    llm = LLM(model=str(merged), dtype="float32", enforce_eager=True, max_model_len=1024)
    params = SamplingParams(temperature=0.0, max_tokens=32, logprobs=1)
    (result,) = llm.generate([{"prompt_token_ids": ids}], params)
    sampled = list(result.outputs[0].token_ids)
    model = AutoModelForCausalLM.from_pretrained(merged)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
    expected = out[0, len(ids) :].tolist()
    pairs = enumerate(zip(sampled, expected, strict=False))  # both may stop early
    agree = next((i for i, (a, b) in pairs if a != b), min(len(sampled), len(expected)))
    print(f"vLLM generates {tokenizer.decode(sampled)!r}")
    print(f"vLLM vs transformers, greedy: {agree} of {len(sampled)} tokens agree")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", type=Path)
    parser.add_argument("--to", type=Path, default=Path("/tmp/elsewhere"))
    parser.add_argument("--vllm", type=Path, help="a merged export to generate from with vLLM")
    args = parser.parse_args()
    with_vllm(args.vllm) if args.vllm else travel(args.run, args.to)
