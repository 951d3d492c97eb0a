"""Episodes kept on disk for reading later (`agentgym view`): one `.npz` file per training
step (`RUN/episodes/step-000001.npz`) or per evaluated model (`REPORT/episodes-model.npz`).

A file holds two kinds of thing. `meta`, one JSON document (UTF-8 bytes): per episode its
task, group, reward and reward parts, advantage, finish reason, errors, env, category, tool
counts, prompt messages and turns (action and observation), and, where its tokens are kept,
its prompt length, turn spans and where its tokens lie in the arrays (an episode split into
samples, where its history was rewritten: each earlier sample's, under `"samples"`, with
`"opened_by"`). And flat arrays of
every kept episode's tokens end to end, so a file of a thousand episodes is six arrays, not
a thousand JSON lists of integers: `tokens` (int32), `loss_mask` (uint8), `logprobs`
(float32), `versions` (int32: the policy version that sampled each token, -1 where the
policy did not sample it) and `advantages` (float32: the advantage the learner gave each
sampled token, 0 elsewhere; absent for an evaluation). Episode i's tokens are
`tokens[start:end]` with (start, end) its meta's `"span"`. With a tokenizer, `meta["vocab"]`
holds each kept id's text, so the file reads without the model.

Which episodes keep their tokens: the first `token_share` of them (by order: the groups as
played), while the token arrays stay under `max_bytes` (about 13 bytes a token); the
others keep their messages and figures only (`"span"` null). The write is atomic: a reader
never sees half a file.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentgym.types import Trajectory

BYTES_PER_TOKEN = 4 + 1 + 4 + 4 + 4
"""What one kept token costs in the arrays: id, mask, logprob, version, advantage."""


def episode_meta(t: Trajectory, advantage: float | None = None) -> dict[str, Any]:
    """An episode's messages and figures (without its tokens), as JSON values."""
    meta: dict[str, Any] = {
        "task_id": t.task_id,
        "group": t.group,
        "reward": _finite(t.reward),
        "reward_parts": {k: _finite(v) for k, v in t.reward_parts.items()},
        "advantage": advantage,
        "finish_reason": t.finish_reason,
        "truncated": t.truncated,
        "error": t.error,
        "reward_error": t.reward_error,
        "env": t.env,
        "category": t.category,
        "counts": dict(t.counts),
        "prompt": [m.to_dict() for m in t.prompt_messages],
        "turns": [
            {
                "action": turn.action,
                "observation": [m.to_dict() for m in turn.observation],
                "reward_parts": {k: _finite(v) for k, v in turn.reward_parts.items()},
            }
            for turn in t.turns
        ],
        "span": None,
    }
    return meta


def write_episodes(
    path: Path,
    trajectories: Sequence[Trajectory],
    advantages: Sequence[Sequence[float]] | None = None,
    *,
    token_share: float = 1.0,
    max_bytes: int = 32 << 20,
    extra: dict[str, Any] | None = None,
    decode: Callable[[int], str] | None = None,
    labels: Sequence[dict[str, Any]] | None = None,
) -> Path:
    """Writes `trajectories` to `path` (see the module's docstring); returns it.

    Args:
        advantages: Per episode, the advantage of each token (aligned with its `tokens`;
            0 off the sampled ones); None: not trained on (an evaluation).
        token_share: The share of episodes, the first ones, whose tokens are kept (0 to 1).
        max_bytes: The most the token arrays may take; the episodes past it keep no tokens.
        extra: JSON values stored beside the episodes in `meta` (the step, the model).
        decode: A token id's text (the tokenizer's); with it, `meta["vocab"]` maps each
            kept id (as a string) to its text, so a reader needs no tokenizer.
        labels: Per episode, JSON values added to its meta (an evaluation's `greedy`).
    """
    if not 0.0 <= token_share <= 1.0:
        raise ValueError(f"token_share must be between 0 and 1, got {token_share}")
    with_tokens = math.ceil(token_share * len(trajectories))
    episodes, arrays, used = [], _Arrays(), 0
    for i, t in enumerate(trajectories):
        per_token = advantages[i] if advantages is not None else None
        meta = episode_meta(t, _episode_advantage(t, per_token))
        meta.update(labels[i] if labels is not None else {})
        cost = sum(len(s.tokens) for s in (t, *t.split_samples)) * BYTES_PER_TOKEN
        if i < with_tokens and used + cost <= max_bytes:
            meta.update(_sample_meta(t, arrays, per_token))
            if t.split_samples:  # the earlier samples of a rewritten history, then this one
                meta["samples"] = [_sample_meta(s, arrays, None) for s in t.split_samples]
            used += cost
        episodes.append(meta)
    document: dict[str, Any] = {**(extra or {}), "episodes": episodes}
    data = arrays.finish(trained=advantages is not None)
    if decode is not None:
        document["vocab"] = {str(i): decode(i) for i in np.unique(data["tokens"]).tolist()}
    data["meta"] = np.frombuffer(json.dumps(document).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, allow_pickle=False, **data)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_bytes(buffer.getvalue())
    os.replace(staging, path)
    return path


def _sample_meta(
    t: Trajectory, arrays: _Arrays, per_token: Sequence[float] | None
) -> dict[str, Any]:
    """A sample's tokens added to the arrays: where they lie, its prompt length and turn
    spans, and why it began there (`Trajectory.opened_by`; None for a first sample)."""
    meta = {"span": arrays.add(t, per_token), "prompt_length": t.prompt_length}
    meta["turn_spans"] = [list(s) for s in t.turn_spans]
    if t.opened_by is not None:
        meta["opened_by"] = t.opened_by
    return meta


def read_episodes(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A file `write_episodes` wrote: its meta document and its token arrays by name."""
    with np.load(Path(path)) as data:
        meta = json.loads(data["meta"].tobytes().decode())
        arrays = {name: data[name] for name in data.files if name != "meta"}
    return meta, arrays


def token_advantages(advantages: Sequence[float], length: int) -> list[float]:
    """Per token of an episode of `length` tokens, from the learner's per-target row
    (`StepRecord.advantages[i]`: position j is the advantage of predicting token j + 1)."""
    row = [0.0] * length
    for j, value in enumerate(advantages[: length - 1]):
        row[j + 1] = float(value)
    return row


class _Arrays:
    """The token arrays, growing episode by episode."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {
            k: [] for k in ("tokens", "loss_mask", "logprobs", "versions", "advantages")
        }
        self.length = 0

    def add(self, t: Trajectory, per_token: Sequence[float] | None) -> list[int]:
        n = len(t.tokens)
        versions = t.token_versions or (-1,) * n
        self.parts["tokens"].append(np.asarray(t.tokens, dtype=np.int32))
        self.parts["loss_mask"].append(np.asarray(t.loss_mask, dtype=np.uint8))
        self.parts["logprobs"].append(np.asarray(t.logprobs, dtype=np.float32))
        self.parts["versions"].append(np.asarray(versions, dtype=np.int32))
        self.parts["advantages"].append(np.asarray(per_token or [0.0] * n, dtype=np.float32))
        span = [self.length, self.length + n]
        self.length += n
        return span

    def finish(self, trained: bool) -> dict[str, np.ndarray]:
        dtypes = {"tokens": np.int32, "loss_mask": np.uint8, "logprobs": np.float32}
        dtypes |= {"versions": np.int32, "advantages": np.float32}
        out = {
            name: np.concatenate(parts) if parts else np.zeros(0, dtype=dtypes[name])
            for name, parts in self.parts.items()
        }
        if not trained:
            del out["advantages"]
        return out


def _episode_advantage(t: Trajectory, per_token: Sequence[float] | None) -> float | None:
    """The episode's advantage: the mean over its sampled tokens (GRPO gives each the same);
    None where it was not trained on."""
    if per_token is None:
        return None
    sampled = [a for a, m in zip(per_token, t.loss_mask, strict=False) if m]
    return _finite(sum(sampled) / len(sampled)) if sampled else 0.0


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None
