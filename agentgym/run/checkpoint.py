"""Checkpoints: written whole or not at all, found by step, pruned to the last K.

A checkpoint folder holds the weights (peft's adapter files for a LoRA run, the
whole model otherwise), the tokenizer, `config.yaml`, `state.json` (the step
and whatever the trainer needs to resume: counters, RNG states, the metric
history) and, for a training checkpoint, `optimizer.pt` (optimizer and
scheduler state, torch's RNG state). `MANIFEST.json` (every file's size and sha256,
`agentgym.policy.integrity`) then `COMPLETE` are written last; weights that are not finite
are not saved (the run stops). Weights are
saved in the dtype they trained in, never upcast: a bf16 model (`model.precision`)
writes bf16 tensors; peft keeps LoRA adapters in float32, and so do their files.
`checkpoint-best` of a LoRA run is the whole model with the adapters merged in (what
plain transformers and vLLM load from anywhere), its adapters in `adapter/` beside.

Checkpoints travel: a model they name (adapters' base model, the start model in
`state.json`) is written so that it resolves wherever the run folder goes
(`portable_name`): a built-in model by its name (`embedded`, `tiny-random`), a folder
inside the run (`checkpoint-sft`) by its path relative to the checkpoint, anything else
(a hub id, the user's own folder) as given.

Writes go to a hidden staging folder beside the target; every file is flushed to
disk, then the folder is renamed into place, so a process killed at any moment
(`kill -9` included) leaves either the old checkpoint or the new one, never half
of one. `checkpoint-best` is a symbolic link, swapped atomically, to the folder
holding the best step (`checkpoint-best-000010`), for the same reason.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import yaml

from agentgym.config import Config
from agentgym.policy.integrity import (
    CheckpointError,
    check_finite,
    read_json,
    read_torch,
    verify,
    write_manifest,
)
from agentgym.policy.models import built_in_name
from agentgym.types import TrainingError

COMPLETE = "COMPLETE"
BEST = "checkpoint-best"
ADAPTER_DIR = "adapter"
_NUMBERED = re.compile(r"^checkpoint-(\d+)$")


def save_checkpoint(
    run_dir: Path,
    step: int,
    model,
    tokenizer,
    config: Config,
    name: str | None = None,
    state: dict[str, Any] | None = None,
    trainer: dict[str, Any] | None = None,
    merged: bool = False,
) -> Path:
    """Writes `run_dir/checkpoint-{step:06d}` (or `run_dir/{name}`) atomically; returns it.

    Args:
        state: JSON-able resume state, merged into `state.json` beside the step.
        trainer: Tensors and their containers (optimizer and scheduler state
            dicts, RNG state), saved to `optimizer.pt` with `torch.save`.
        merged: A LoRA model is written whole, its adapters merged into a copy, with
            the adapters in `adapter/`; `model` itself is left as it is.
    """
    run_dir = Path(run_dir)
    target = run_dir / (name or f"checkpoint-{step:06d}")
    try:
        check_finite(model, f"step {step}'s weights, not saved as {target.name}")
    except CheckpointError as err:
        raise TrainingError(f"{err}; the run's earlier checkpoints stay as they were") from None
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=run_dir))
    try:
        _save_weights(model, staging, target, run_dir, merged)
        tokenizer.save_pretrained(staging)
        (staging / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json")))
        (staging / "state.json").write_text(json.dumps({"step": step, **(state or {})}))
        if trainer is not None:
            torch.save(trainer, staging / "optimizer.pt")
        write_manifest(staging)
        (staging / COMPLETE).write_text(f"{step}\n")
        shared_as_umask(staging)
        _flush_tree(staging)
        old = None
        if target.exists():
            old = target.rename(run_dir / f".{target.name}.old")
        staging.rename(target)
        _fsync(run_dir)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def shared_as_umask(folder: Path) -> None:
    """The folder and its files with the modes the umask gives new ones (0755 and 0644 under
    the usual 022): mkdtemp makes the folder private and safetensors its files."""
    mask = os.umask(0)
    os.umask(mask)
    folder.chmod(0o777 & ~mask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def save_best(run_dir: Path, step: int, model, tokenizer, config: Config) -> Path:
    """Writes `checkpoint-best-{step}` and points the `checkpoint-best` link at it.

    The link is replaced with one rename, so `checkpoint-best` always resolves
    to a complete checkpoint; the previous best folder goes after the swap.
    """
    run_dir = Path(run_dir)
    folder = save_checkpoint(
        run_dir, step, model, tokenizer, config, f"{BEST}-{step:06d}", merged=True
    )
    link = run_dir / BEST
    before = link.resolve() if link.is_symlink() else None
    if link.exists() and not link.is_symlink():  # a run from before links: a plain folder
        shutil.rmtree(link)
    staging = run_dir / f".{BEST}.link"
    staging.unlink(missing_ok=True)
    staging.symlink_to(folder.name)
    os.replace(staging, link)
    _fsync(run_dir)
    if before is not None and before != folder.resolve() and before.parent == run_dir.resolve():
        shutil.rmtree(before, ignore_errors=True)
    return link


def _save_weights(model, staging: Path, target: Path, run_dir: Path, merged: bool) -> None:
    """The weights into `staging` (to become `target`), any adapters' base named portably."""
    if merged and hasattr(model, "peft_config"):
        copy.deepcopy(model).merge_and_unload().save_pretrained(staging, safe_serialization=True)
        staging, target = staging / ADAPTER_DIR, target / ADAPTER_DIR
    model.save_pretrained(staging, safe_serialization=True)
    adapter_config = staging / "adapter_config.json"
    if adapter_config.is_file():
        written = json.loads(adapter_config.read_text())
        base = written.get("base_model_name_or_path")
        written["base_model_name_or_path"] = portable_name(base, target, run_dir)
        adapter_config.write_text(json.dumps(written, indent=2, sort_keys=True) + "\n")


def portable_name(name: str | None, origin: Path, run_dir: Path) -> str | None:
    """The model `name` as a checkpoint at `origin` (inside `run_dir`) names it, so that it
    resolves wherever the run folder goes: a built-in model's cached folder by the model's
    name, a folder inside the run by its path relative to `origin`, else as it is."""
    if name is None:
        return None
    if built := built_in_name(name):
        return built
    path = Path(name)
    if path.is_absolute() and path.resolve().is_relative_to(Path(run_dir).resolve()):
        return os.path.relpath(path.resolve(), Path(origin).resolve())
    return name


def is_complete(folder: Path) -> bool:
    """Whether `folder` is a checkpoint whose write finished."""
    return (Path(folder) / COMPLETE).is_file()


def numbered_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """The complete `checkpoint-NNNNNN` folders of a run, as (step, path), oldest first."""
    found = []
    for path in Path(run_dir).iterdir() if Path(run_dir).is_dir() else ():
        match = _NUMBERED.match(path.name)
        if match and is_complete(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete numbered checkpoint of a run, or None."""
    found = numbered_checkpoints(run_dir)
    return found[-1][1] if found else None


def prune(run_dir: Path, keep: int) -> None:
    """Deletes all but the newest `keep` numbered checkpoints, and staging folders that a
    killed write left behind (`checkpoint-best*` and `checkpoint-sft` are kept)."""
    run_dir = Path(run_dir)
    for _, path in numbered_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(path)
    for path in run_dir.glob(".checkpoint-*"):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def read_state(folder: Path) -> dict[str, Any]:
    """A checkpoint's `state.json`, once its files are verified against its manifest
    (`agentgym.policy.integrity`); a clear error when the folder is not a complete one."""
    folder = Path(folder)
    if not is_complete(folder):
        raise FileNotFoundError(
            f"{folder} is not a complete checkpoint (no {COMPLETE} file): its write did not "
            "finish, or it is not a checkpoint folder"
        )
    verify(folder)
    return read_json(folder / "state.json")


def read_trainer(folder: Path) -> dict[str, Any]:
    """A training checkpoint's `optimizer.pt` (optimizer, scheduler, torch RNG)."""
    path = Path(folder) / "optimizer.pt"
    if not path.is_file():
        raise FileNotFoundError(
            f"{folder} holds no optimizer.pt: it is a model checkpoint (sft, best), not one "
            "a training run can resume from; give a checkpoint-NNNNNN folder"
        )
    trainer: dict[str, Any] = read_torch(path)
    return trainer


def _flush_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    _fsync(folder)


def _fsync(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
