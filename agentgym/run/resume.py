"""What a training run carries across a stop: its progress, and how a checkpoint is written
from it and read back (`agentgym train --resume`).

A training checkpoint holds, besides the weights: AdamW's and the schedule's
state, torch's, Python's and NumPy's RNG states, the run's own generator (the
task stream and the sampling seeds), the step and skip counters, the metric
history (health checks and best-step selection read it) and the held-out
evaluations made so far (the closing table needs them). Restored, the run goes
on bitwise as if it had never stopped, on CPU.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym.config import Config
from agentgym.eval.heldout import TaskResult
from agentgym.learn.learner import Learner
from agentgym.learn.lora import wrap_lora
from agentgym.policy.integrity import load_tensors
from agentgym.policy.models import load_configured, resolve_from
from agentgym.records import CheckpointState
from agentgym.run.checkpoint import (
    ADAPTER_DIR,
    portable_name,
    prune,
    read_state,
    read_trainer,
    save_checkpoint,
)
from agentgym.scale import ranks
from agentgym.types import TaskSpec


@dataclass
class Progress:
    """Where the GRPO loop stands: what a checkpoint must hold to resume it exactly."""

    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    best_step: int | None = None
    skipped_steps: int = 0
    consecutive_skips: int = 0
    start_selection: dict[str, Any] | None = None
    """The start model's selection figures, as a history row of step 0 (None: not scored)."""

    def candidates(self) -> list[dict[str, Any]]:
        """The rows `checkpoint-best` is chosen among: the start's (step 0), then each step's."""
        start = [self.start_selection] if self.start_selection is not None else []
        return start + self.history


def learner_for(config: Config, model, start_model: str | None, resume: Path | None) -> Learner:
    """The learner; a resumed run's gets the checkpoint's weights (adapters, or the whole
    model with the start model as its KL reference)."""
    if resume is None:
        return Learner(model, config)
    if config.lora.enabled:  # adapters in before the learner shards them ('fsdp')
        model = wrap_lora(model, config)
        load_trainable(model, Path(resume))
        return Learner(model, config)
    trained, _ = load_configured(str(resume), config.model)
    return Learner(trained.to(next(model.parameters()).device), config, reference=model)


ADAPTER_FILE = "adapter_model.safetensors"


@dataclass(frozen=True)
class Submitted:
    """One step's tasks as handed to the sampler, and where the run's generator stood before
    it drew them (its `bit_generator.state`)."""

    specs: tuple[TaskSpec, ...]
    stream: Mapping[str, Any]


@dataclass
class Trainer:
    """The learner and where GRPO stands: what a training checkpoint is written from,
    besides the run's config, start model and evaluations (`Trainer.save`)."""

    learner: Learner
    tokenizer: Any
    rng: np.random.Generator
    """The run's own generator: the task stream and the sampling seeds."""
    progress: Progress
    unsharded: Any = None
    """Rank 0's whole copy of a sharded learner's model (`ranks.unsharded_copy`), kept
    in step with it; None when the learner's own model is whole."""
    submitted: deque[Submitted] = field(default_factory=deque)
    """Steps whose tasks the sampler was handed ahead of the learner, oldest first
    (asynchronous GRPO, `pipeline.max_off_policy_steps`); empty between synchronous steps."""
    staleness: int = 0
    """k: how many steps the sampler plays ahead of the learner (asynchronous GRPO with
    `pipeline.max_off_policy_steps` k; 0: synchronous), as `Run.start_training` decided."""
    off_policy: bool = False
    """The sampler's logprobs are not the learner's (a separate engine, or weights up to k
    steps older): the update recomputes the learner's and corrects for the difference."""

    @property
    def model(self):
        """The model whose weights checkpoints hold, whole, as one process saves them."""
        return self.learner.model if self.unsharded is None else self.unsharded

    def save(
        self,
        step: int,
        config: Config,
        start_model: str | None,
        results: dict[str, list[TaskResult]],
        sampler_weights: Mapping[int, list[tuple[str, torch.Tensor]]] | None = None,
    ) -> Path:
        """Writes `checkpoint-{step}` (weights, optimizer, schedule, RNG states, counters,
        the metric history, `results`: the evaluations so far) and prunes to `run.keep_last`.
        `sampler_weights`, by version: the older weights the steps handed ahead are to be
        played with (`AheadSampler.kept`), saved with the optimizer's state."""
        run = config.run
        assert run.output is not None  # the CLI (or the caller) names the run's folder
        p = self.progress
        state = CheckpointState(
            step=step,
            start_model=portable_name(start_model, run.output, run.output),
            history=p.history,
            best_step=p.best_step,
            skipped_steps=p.skipped_steps,
            consecutive_skips=p.consecutive_skips,
            start_selection=p.start_selection,
            rng={
                "python": random.getstate(),
                "numpy": _numpy_state(),
                # a checkpoint goes back to before the tasks handed ahead were drawn: a
                # resumed run draws them again, to play them with `sampler_weights`
                "run": self.submitted[0].stream if self.submitted else self.rng.bit_generator.state,
            },
            evals={k: [dataclasses.asdict(r) for r in v] for k, v in results.items()},
        ).to_json()
        trainer = {"learner": ranks.share_state(self.learner), "torch_rng": torch.get_rng_state()}
        if sampler_weights:
            trainer["sampler_weights"] = dict(sampler_weights)
        folder = save_checkpoint(
            run.output, step, self.model, self.tokenizer, config, state=state, trainer=trainer
        )
        prune(run.output, run.keep_last)
        return folder


def resume_state(folder: Path) -> CheckpointState:
    """A training checkpoint's state (`state.json`, read by `read_state`); a start model
    inside the run folder (`checkpoint-sft`) found where the folder is now."""
    state = CheckpointState.from_json(read_state(folder))
    if state.start_model is None:
        return state
    return dataclasses.replace(state, start_model=resolve_from(state.start_model, folder.parent))


def restore(state: CheckpointState, resume: Path, learner: Learner, rng) -> Progress:
    """Puts a checkpoint's optimizer, schedule and RNG states back; returns its progress."""
    trainer = read_trainer(resume)
    learner.load_state_dict(trainer["learner"])
    torch.set_rng_state(trainer["torch_rng"])
    version, internal, gauss = state.rng["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state.rng["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    rng.bit_generator.state = state.rng["run"]
    return Progress(
        step=state.step,
        history=state.history,
        best_step=state.best_step,
        skipped_steps=state.skipped_steps,
        consecutive_skips=state.consecutive_skips,
        start_selection=state.start_selection,
    )


def _numpy_state() -> list[Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    assert isinstance(keys, np.ndarray)  # the legacy tuple: (name, keys, pos, has_gauss, cached)
    return [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]


def load_trainable(model, folder: Path) -> None:
    """Loads a checkpoint's trained weights (LoRA adapters, or the whole model) into `model`."""
    adapters = [
        f for f in (folder / ADAPTER_FILE, folder / ADAPTER_DIR / ADAPTER_FILE) if f.is_file()
    ]
    if adapters and hasattr(model, "peft_config"):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_tensors(adapters[0]))
        return
    missing, unexpected = model.load_state_dict(
        load_tensors(folder / "model.safetensors"), strict=False
    )
    absent = {k for k in missing if not ("lm_head" in k and model.config.tie_word_embeddings)}
    if unexpected or absent:
        raise ValueError(
            f"{folder}: weights do not fit the model (missing {sorted(absent)[:3]}, "
            f"unexpected {unexpected[:3]})"
        )
