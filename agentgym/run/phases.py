"""The stages around GRPO: the start model's evaluation, the SFT warm-up and its
evaluation (`before_grpo`), and at the end the best checkpoint's evaluation with the
closing table (`closing_report`), beside SFT trained for as long (`sft_long`); and the
warm-up as a run of its own (`sft`, the `agentgym sft` command)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from agentgym import records
from agentgym.config import Config
from agentgym.eval.console import Stages, print_report
from agentgym.eval.heldout import HeldOut, TaskResult
from agentgym.eval.report import build_report, write_report
from agentgym.policy.hf import HFPolicy
from agentgym.policy.models import load_configured, on_device, resolve_model_name
from agentgym.run.checkpoint import BEST, save_checkpoint
from agentgym.run.interrupt import StopRequest
from agentgym.run.record import evaluate
from agentgym.run.resume import load_trainable
from agentgym.run.setup import Run
from agentgym.scale import ranks
from agentgym.sft.warmup import long_config, warm_up

logger = logging.getLogger(__name__)

SFT_LONG = "sft-long"
"""The closing table's row of SFT trained on past the warm-up (`sft.long`)."""


def owed_sft_evaluation(run: Run, model: Any, tokenizer: Any, stages: Stages) -> None:
    """A resumed run that stopped after SFT, before SFT's evaluation, evaluates it now."""
    config = run.config
    if run.report_set is not None and config.sft.warmup and "sft" not in run.results:
        policy = HFPolicy(model, tokenizer)
        run.results["sft"] = evaluate(run.report_set, policy, stages, "eval sft", config.run.seed)


def before_grpo(run: Run, model, tokenizer, stages: Stages, stop: StopRequest):
    """The start model's evaluation and the SFT warm-up with its evaluation; returns the
    model GRPO starts from (None when a stop request came first), and sets the run's
    `start_model` (a folder, once SFT wrote one)."""
    config, results, seed = run.config, run.results, run.config.run.seed
    if run.start_set is not None:
        results["start"] = evaluate(
            run.start_set, HFPolicy(model, tokenizer), stages, "eval start", seed
        )
    if stop.requested:
        return None
    if config.sft.warmup:
        task = stages.stage("sft", config.sft.steps)
        model, records = warm_up(model, tokenizer, config, advance=lambda: stages.advance(task))
        with open(run.out / "sft_metrics.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        stages.note(task, f"loss {records[-1]['sft/loss']:.3f}", done=True)
        folder = save_checkpoint(
            run.out, config.sft.steps, model, tokenizer, config, name="checkpoint-sft"
        )
        # GRPO's checkpoints name this folder as their base model: LoRA adapters saved
        # from here on are adapters of the SFT model, not of the model SFT started from.
        run.start_model = model.name_or_path = str(folder.resolve())
        if run.report_set is not None and not stop.requested:
            results["sft"] = evaluate(
                run.report_set, HFPolicy(model, tokenizer), stages, "eval sft", seed
            )
    return model


def say_stopped(stop: StopRequest, step: int, folder: Path) -> None:
    logger.info(
        "stopped on %s after step %d; checkpoint %s. Resume with: agentgym train --resume %s",
        stop.requested,
        step,
        folder,
        folder,
    )


def closing_report(run: Run, report_set: HeldOut, stages: Stages) -> None:
    """Evaluates the best checkpoint (or the last weights) and writes the closing table."""
    config, results, out, t = run.config, run.results, run.out, run.training()
    name = "grpo"  # the last weights, unless a best step is kept
    with run.evaluating() as policy:
        if t.progress.best_step is not None:
            load_trainable(t.model, out / BEST)
            if policy.model is not t.model:  # a copy of its own (vLLM): the best weights go in
                policy.load_weights(ranks.share_weights(t.learner))
            name = f"best@{t.progress.best_step}"
        results[name] = evaluate(report_set, policy, stages, "eval best", config.run.seed)
    pairs = [(b, a) for a, b in zip(results, list(results)[1:], strict=False)]
    if len(results) == 3:
        pairs.append((name, "start"))
    if config.sft.long != "off":
        results[SFT_LONG] = sft_long(run, report_set, stages)
        pairs += [(name, SFT_LONG), (SFT_LONG, "sft")]
    meta = {
        "env": config.run.env,
        "env_kwargs": config.run.env_kwargs,
        "model": resolve_model_name(config.model.name),
        "split": config.eval.split,
        "decoding": "greedy",
    }
    report = build_report(results, k=max(config.eval.n, 1), comparisons=pairs, meta=meta)
    write_report(out / "report", report)
    print_report(report, stages.bar.console)


def sft_long(run: Run, report_set: HeldOut, stages: Stages) -> list[TaskResult]:
    """The `sft-long` model's results: SFT from the start model for `sft.long` steps, or
    for as long as SFT and GRPO trained (`sft/warmup.long_config`), on fresh demonstrations;
    its step records go to sft_long_metrics.jsonl."""
    config, out = run.config, run.out
    sft_records = [json.loads(x) for x in (out / "sft_metrics.jsonl").read_text().splitlines()]
    grpo_seconds = sum(float(h[records.STEP_SECONDS]) for h in run.training().progress.history)
    long = long_config(config, [r["step_seconds"] for r in sft_records], grpo_seconds)
    model, tokenizer = load_configured(config.model.name, config.model)
    model = on_device(model, config)
    task = stages.stage(SFT_LONG, long.sft.steps)
    torch.manual_seed(config.run.seed)  # its LoRA adapters start as a run's first ones do
    model, steps = warm_up(model, tokenizer, long, advance=lambda: stages.advance(task))
    with open(out / "sft_long_metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in steps)
    note = f"{long.sft.steps} steps, {sum(r['step_seconds'] for r in steps):.0f} s"
    stages.note(task, f"{note} (GRPO trained {grpo_seconds:.0f} s)", done=True)
    policy = HFPolicy(model, tokenizer)
    return evaluate(report_set, policy, stages, f"eval {SFT_LONG}", config.run.seed)


def sft(config: Config) -> Path:
    """Fine-tunes on demonstrations for `config.sft.steps` steps; returns the run directory.

    The checkpoint holds the whole model (LoRA adapters merged), so `--model`
    takes it like any other model folder.
    """
    assert config.run.output is not None  # the CLI names the run's folder first
    out = Path(config.run.output)
    torch.manual_seed(config.run.seed)
    model, tokenizer = load_configured(config.model.name, config.model)
    model = on_device(model, config)
    out.mkdir(parents=True, exist_ok=True)
    with Stages() as stages:  # each step's loss beside the bar (a line a step in a log file)
        task = stages.stage("sft", config.sft.steps)

        def show(_model, record: dict) -> None:
            stages.note(task, f"step {record['step']}: loss {record['sft/loss']:.3f}")

        advance = lambda: stages.advance(task)  # noqa: E731
        model, records = warm_up(model, tokenizer, config, advance=advance, after_step=show)
        stages.note(
            task, f"loss {records[0]['sft/loss']:.3f} -> {records[-1]['sft/loss']:.3f}", done=True
        )
    with open(out / "metrics.jsonl", "a") as log:
        for record in records:
            log.write(json.dumps(record) + "\n")
    save_checkpoint(out, config.sft.steps, model, tokenizer, config)
    return out
