"""Checkpoints: safetensors weights, the tokenizer and the config, written atomically."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import yaml

from agentgym.config import Config


def save_checkpoint(
    run_dir: Path, step: int, model, tokenizer, config: Config, name: str | None = None
) -> Path:
    """Writes `run_dir/checkpoint-{step}` (or `run_dir/{name}`); a crash midway leaves no
    half-written checkpoint.

    The files go to a temporary folder beside the target, which is renamed into
    place only once complete. A LoRA run saves its adapters (peft's
    `adapter_model.safetensors`), a full run the whole model.
    """
    target = Path(run_dir) / (name or f"checkpoint-{step:06d}")
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=run_dir))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        (staging / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json")))
        (staging / "state.json").write_text(json.dumps({"step": step}))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
