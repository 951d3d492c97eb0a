"""Checkpoints that prove their integrity: a manifest of every file's sha256, written last
but for `COMPLETE`; verified before a checkpoint is resumed or loaded; finite weights only.

`MANIFEST.json` lists each file of the folder (its path inside it, byte count and sha256).
`verify` reads every listed file back and refuses the checkpoint, naming the file, when
one is missing, shorter or longer, or hashes otherwise: a weights file overwritten after
the run wrote it, a truncated `optimizer.pt`, a hand-edited `state.json`. A checkpoint
written before manifests existed has none and is read as before (its files are still
checked as they load: an unreadable one is named).

Weights are checked finite twice: `check_finite` before a save (a step that made them NaN
or infinite stops the run there, and the last checkpoint stays the last good one) and after
a load. Each failure is a `CheckpointError`, a `ConfigError` (the CLI's exit 2).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from agentgym.config.files import ConfigError

MANIFEST = "MANIFEST.json"
_CHUNK = 1 << 20


class CheckpointError(ConfigError):
    """A checkpoint that is damaged, changed since it was written, or holds non-finite
    weights; the message names the file (and the tensor)."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: Path, skip: tuple[str, ...] = ()) -> Path:
    """`folder/MANIFEST.json`: each file below `folder` (but `skip`) with its bytes and sha256."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if name != MANIFEST and name not in skip:
            files[name] = {"bytes": path.stat().st_size, "sha256": sha256(path)}
    target = folder / MANIFEST
    target.write_text(json.dumps({"version": 1, "files": files}, indent=1, sort_keys=True) + "\n")
    return target


def verify(folder: Path) -> bool:
    """Checks every file `folder`'s manifest lists against it; False where it has none (a
    checkpoint from before manifests). CheckpointError naming the first file that differs."""
    folder = Path(folder)
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return False
    try:
        files: dict[str, dict[str, Any]] = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{manifest}: unreadable ({err}); {_ADVICE}") from None
    for name, want in files.items():
        path = folder / name
        problem = _differs(path, want)
        if problem:
            raise CheckpointError(
                f"{path}: {problem}, not as the run wrote it (MANIFEST.json records each file's "
                f"size and sha256); {_ADVICE}"
            )
    return True


_ADVICE = "restore the file, or resume from or load another checkpoint of the run"


def _differs(path: Path, want: dict[str, Any]) -> str | None:
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if size != want.get("bytes"):
        return f"{size} bytes where {want.get('bytes')} were written (truncated or replaced)"
    if sha256(path) != want.get("sha256"):
        return "its contents changed (sha256 differs)"
    return None


def check_finite(tensors: dict[str, torch.Tensor] | Any, where: str) -> None:
    """CheckpointError naming the first tensor of `tensors` (a state dict, or a model's
    named parameters) holding NaN or an infinity; `where` says what they are."""
    items = tensors.items() if isinstance(tensors, dict) else tensors.named_parameters()
    for name, tensor in items:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckpointError(
                f"{where}: tensor {name!r} holds {bad} non-finite value(s) (NaN or inf): "
                "such weights are neither saved nor loaded"
            )


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors, checked finite; CheckpointError naming the file when it
    cannot be read (truncated, not safetensors)."""
    from safetensors.torch import load_file

    try:
        tensors = load_file(path)
    except Exception as err:  # safetensors raises its own error types for damaged files
        raise CheckpointError(f"{path}: unreadable weights ({err}); {_ADVICE}") from None
    check_finite(tensors, str(path))
    return tensors


def read_json(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON file (`state.json`); CheckpointError naming it when unreadable."""
    try:
        value = json.loads(Path(path).read_text())
    except (ValueError, UnicodeDecodeError, OSError) as err:
        raise CheckpointError(f"{path}: unreadable ({err}); {_ADVICE}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: holds {type(value).__name__}, not an object; {_ADVICE}")
    return value


def read_torch(path: Path) -> Any:
    """`torch.load` of a checkpoint's `optimizer.pt` (weights only); CheckpointError naming
    it when unreadable."""
    try:
        return torch.load(path, weights_only=True)
    except Exception as err:  # a damaged pickle or zip raises many kinds
        raise CheckpointError(
            f"{path}: unreadable ({type(err).__name__}: {err}); {_ADVICE}"
        ) from None
