"""What `agentgym view` shows, read from a run folder or an eval report folder, as JSON
values the page's script reads (`agentgym.view.page` writes them into the page).

A step (of a run) or a model (of a report) is a list of episodes, each as `episode_view`
makes it: the figures the list sorts and filters on, the messages, and, where its tokens
were kept, the ids (`t`), the loss mask as a string of 0 and 1 (`m`), the logprobs rounded
to 3 places (`l`) and the versions (`v`). Token texts are in one `vocab` (id -> text) for
the whole page, the union of the files'.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from agentgym import records
from agentgym.eval.episode_files import read_episodes

CURVES = (
    (records.REWARD_MEAN, "reward"),
    (records.CORRECTNESS_RATE, "correctness"),
    (records.KL, "KL"),
    (records.ENTROPY, "entropy"),
    (records.COMPLETION_LENGTH, "length"),
    (records.FAILED_FRACTION, "failures"),
)
"""The curves a run's page draws: metric name -> label (a metric a run lacks is left out)."""


def episode_view(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """One episode as the page reads it (see the module's docstring)."""
    counts = meta.get("counts", {})
    errors = {
        k.removeprefix("tool_errors/"): v for k, v in counts.items() if k.startswith("tool_errors/")
    }
    parts = meta.get("reward_parts", {})
    view: dict[str, Any] = {
        "task": meta["task_id"],
        "group": meta["group"],
        "reward": meta["reward"],
        "parts": parts,
        "adv": meta.get("advantage"),
        "correct": (parts.get("correctness") or 0) >= 1,
        "finish": meta["finish_reason"],
        "truncated": meta["truncated"],
        "error": meta.get("error"),
        "reward_error": meta.get("reward_error"),
        "unscorable": meta.get("error") is not None or meta.get("reward_error") is not None,
        "env": meta.get("env"),
        "category": meta.get("category"),
        "calls": counts.get("tool_calls", 0),
        "errors": errors,
        "prompt": meta["prompt"],
        "turns": meta["turns"],
    }
    if "greedy" in meta:  # an evaluation's: greedy, or its task's sample k
        view["greedy"], view["sample"] = meta["greedy"], meta.get("sample", 0)
    if meta.get("span") is not None:
        view.update(_tokens(meta, arrays))
    earlier = meta.get("samples", [])
    if earlier:  # its chat template or its agent rewrote the history: several samples
        first = 0
        view["samples"] = []
        for sample in earlier:
            last = first + len(sample.get("turn_spans", []))
            view["samples"].append({**_tokens(sample, arrays), "turns_in": [first, last]})
            view["samples"][-1]["opened_by"] = sample.get("opened_by")
            first = last
        view["turns_in"], view["opened_by"] = [first, len(meta["turns"])], meta.get("opened_by")
    return view


def _tokens(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """A sample's kept tokens as the page reads them: ids, mask, logprobs, versions and
    its prompt's length (empty where its tokens were not kept)."""
    if meta.get("span") is None:
        return {}
    start, end = meta["span"]
    return {
        "t": arrays["tokens"][start:end].tolist(),
        "m": "".join(map(str, arrays["loss_mask"][start:end].tolist())),
        "l": np.round(arrays["logprobs"][start:end].astype(np.float64), 3).tolist(),
        "v": arrays["versions"][start:end].tolist(),
        "p": meta.get("prompt_length", 0),
    }


class UnreadableFile(ValueError):
    """A run's or a report's file that cannot be read as agentgym writes it; names it."""


def _episodes(path: Path, vocab: dict[str, str]) -> list[dict[str, Any]]:
    try:
        meta, arrays = read_episodes(path)
        vocab.update(meta.get("vocab", {}))
        return [episode_view(e, arrays) for e in meta["episodes"]]
    except Exception as err:  # a damaged npz, zip, JSON or array raises each its own type
        raise UnreadableFile(
            f"{path}: not an episodes file as agentgym writes it ({type(err).__name__}: "
            f"{str(err)[:300]}); remove it, or run again with run.episode_tokens"
        ) from None


def _json_lines(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file (blank lines skipped); UnreadableFile naming the
    line that is not one."""
    rows = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise UnreadableFile(f"{path}: line {number} is not JSON ({err})") from None
        if not isinstance(row, dict):
            raise UnreadableFile(f"{path}: line {number} is not a JSON object")
        rows.append(row)
    return rows


def _json_file(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(errors="replace"))
    except ValueError as err:
        raise UnreadableFile(f"{path}: not JSON ({err})") from None
    if not isinstance(value, dict) or not isinstance(value.get("tasks"), dict):
        raise UnreadableFile(f"{path}: not a report as agentgym eval writes it (no 'tasks')")
    return value


def run_view(folder: Path) -> dict[str, Any]:
    """A run folder's page data: its curves (from metrics.jsonl, health warnings marked)
    and each step's episodes (from episodes/step-NNNNNN.npz), oldest first, by step."""
    folder = Path(folder)
    files = sorted((folder / "episodes").glob("step-*.npz"))
    metrics = folder / "metrics.jsonl"
    if not files and not metrics.is_file():
        raise FileNotFoundError(
            f"{folder}: neither episodes/step-*.npz nor metrics.jsonl; give a training run's "
            "folder (run.output) or an eval report's (holding report.json)"
        )
    rows = _json_lines(metrics) if metrics.is_file() else []
    vocab: dict[str, str] = {}
    steps = {
        int(f.stem.removeprefix("step-")): _episodes(f, vocab)
        for f in files
        if f.stem.removeprefix("step-").isdigit()
    }
    return {
        "kind": "run",
        "title": folder.resolve().name,
        "curves": curves(rows),
        "steps": steps,
        "vocab": vocab,
    }


def curves(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The steps, each curve's values (None where a row lacks it) and the health warnings
    (step -> kinds) of metrics.jsonl's rows."""
    benchmarks = dict.fromkeys(  # eval.benchmarks' figures, each benchmark and category
        k for r in rows for k in r if k.startswith(records.BENCH_PREFIX) and k.count("/") <= 3
    )
    named = [*CURVES, *((k, k.removesuffix("/correctness")) for k in benchmarks)]
    series = {
        label: [r.get(name) for r in rows]
        for name, label in named
        if any(r.get(name) is not None for r in rows)
    }
    health = {r["step"]: r["health"] for r in rows if r.get("health")}
    return {"steps": [r["step"] for r in rows], "series": series, "health": health}


def report_view(folder: Path) -> dict[str, Any]:
    """An eval report folder's page data: per model (and baseline) its episodes, and per
    task the figures of each (greedy correctness, mean reward) and their difference."""
    folder = Path(folder)
    report = _json_file(folder / "report.json")
    vocab: dict[str, str] = {}
    models = {
        role: _episodes(folder / f"episodes-{role}.npz", vocab)
        for role in report["tasks"]
        if (folder / f"episodes-{role}.npz").is_file()
    }
    if not models:
        raise FileNotFoundError(
            f"{folder}: report.json but no episodes-model.npz; evaluate again with "
            "--save-episodes all (the default) to keep the episodes"
        )
    return {
        "kind": "eval",
        "title": folder.resolve().name,
        "meta": report.get("meta", {}),
        "tasks": task_rows(report["tasks"]),
        "models": models,
        "vocab": vocab,
    }


def task_rows(tasks: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per task, each model's greedy strict correctness and mean reward over its episodes,
    and, with a baseline, the model's mean reward less the baseline's."""
    rows = []
    for i, first in enumerate(tasks["model"]):
        row: dict[str, Any] = {"task": first["task_id"]}
        for role, results in tasks.items():
            r = results[i]
            rewards = [e["reward"] for e in [r["greedy"], *r["samples"]]]
            row[role] = {"correct": r["greedy"]["strict"], "reward": sum(rewards) / len(rewards)}
        if "baseline" in row:
            row["diff"] = row["model"]["reward"] - row["baseline"]["reward"]
        rows.append(row)
    return rows
