"""Held-out reports: the figures of per-task results, comparisons, tables and files.

`summarize` turns `TaskResult`s into a report's figures (strict and lenient
correctness, format, reward parts, pass@k, maj@k); `compare` pairs two models on
the same tasks with a bootstrap interval; `build_report` and `write_report` make
`report.json`, `report.md` and `report.png`; `table_rows` and `comparison_lines`
are what the console prints.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agentgym.config import MIX_ENV
from agentgym.env.mixture import member_name
from agentgym.eval.heldout import EpisodeScore, TaskResult
from agentgym.eval.stats import maj_at_k, paired_bootstrap, pass_at_k
from agentgym.records import Comparison, Figures, Interval, ModelSummary, Report


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _episode_figures(
    scores: Sequence[EpisodeScore], at_k: dict[str, float] | None = None
) -> Figures:
    calls = sum(s.tool_calls for s in scores)
    scored = [s for s in scores if not s.unscorable]  # outcomes: the others have none
    parts = sorted({p for s in scored for p in s.parts})
    return Figures(
        correctness_strict=_mean([float(s.strict) for s in scored]),
        correctness_lenient=_mean([float(s.lenient) for s in scored]),
        format_accuracy=_mean([float(s.format_ok) for s in scored]),
        reward_mean=_mean([s.reward for s in scored]),
        reward_parts={p: _mean([s.parts.get(p, 0.0) for s in scored]) for p in parts},
        turns=_mean([s.turns for s in scores]),
        tool_calls=_mean([s.tool_calls for s in scores]),
        tool_error_rate=sum(s.tool_errors for s in scores) / calls if calls else 0.0,
        completion_length=_mean([s.completion_length for s in scores]),
        truncated=_mean([float(s.truncated) for s in scores]),
        unscorable=_mean([float(s.unscorable) for s in scores]),
        at_k=at_k or {},
    )


def _vote_key(score: EpisodeScore) -> str | None:
    """The answer as a vote: every answer equivalent to the expected one votes alike."""
    if score.answer is None:
        return None
    return "<expected>" if score.lenient else score.answer.strip()


def summarize(results: Sequence[TaskResult], k: int = 1) -> ModelSummary:
    """The report's figures: greedy episode figures, and pass@1, pass@k, maj@k when sampled.

    pass@k counts strict correctness; maj@k votes over the first k sampled
    answers, equivalent answers (math-verify) voting together.
    """
    greedy = _episode_figures([r.greedy for r in results])
    n = min((len(r.samples) for r in results), default=0)
    if not n:
        return ModelSummary(tasks=len(results), greedy=greedy)
    if not 1 <= k <= n:
        raise ValueError(f"k={k}; valid: 1 to n={n}, the samples per task")
    correct = [sum(s.strict for s in r.samples) for r in results]
    at_k = {"pass@1": _mean([pass_at_k(n, c, 1) for c in correct])}
    at_k[f"pass@{k}"] = _mean([pass_at_k(n, c, k) for c in correct])
    at_k[f"maj@{k}"] = _mean(
        [maj_at_k([_vote_key(s) for s in r.samples], "<expected>", k) for r in results]
    )
    sampled = _episode_figures([s for r in results for s in r.samples], at_k)
    return ModelSummary(tasks=len(results), greedy=greedy, n=n, k=k, sampled=sampled)


def compare(
    results: Sequence[TaskResult], baseline: Sequence[TaskResult], level: float = 0.95
) -> Comparison:
    """Per-task correctness differences (model - baseline) with bootstrap intervals: greedy,
    strict and lenient, and pass@1 of the sampled episodes when both have them.

    Raises:
        ValueError: unless both hold the same tasks in the same order.
    """
    ids, base_ids = [r.task_id for r in results], [r.task_id for r in baseline]
    if ids != base_ids:
        raise ValueError("compare() needs both models' results on the same tasks, in order")
    intervals: dict[str, Interval] = {}
    scores: dict[str, Callable[[TaskResult], float]] = {
        "correctness_strict": lambda r: float(r.greedy.strict),
        "correctness_lenient": lambda r: float(r.greedy.lenient),
    }
    if all(r.samples for r in (*results, *baseline)):
        scores["pass@1"] = lambda r: _mean([float(s.strict) for s in r.samples])
    for key, score in scores.items():
        diff, low, high = paired_bootstrap(
            [score(r) for r in results], [score(r) for r in baseline], level=level
        )
        intervals[key] = Interval(diff, low, high)
    return Comparison(level=level, tasks=len(ids), intervals=intervals)


def task_records(results: Sequence[TaskResult]) -> list[dict[str, Any]]:
    """The per-task results as JSON-ready dicts; `category` only where the task has one, so
    a report of data without categories reads as it did before they existed."""
    records = [asdict(r) for r in results]
    for record in records:
        if record["category"] is None:
            del record["category"]
    return records


# -- reports -----------------------------------------------------------------------

TABLE_COLUMNS = (
    ("correctness_strict", "strict"),
    ("correctness_lenient", "lenient"),
    ("format_accuracy", "format"),
    ("reward_mean", "reward"),
    ("turns", "turns"),
    ("tool_calls", "calls"),
    ("tool_error_rate", "call err"),
    ("completion_length", "tokens"),
    ("truncated", "truncated"),
    ("unscorable", "unscorable"),
)
"""The greedy figures the printed and markdown tables show, with their headers."""


def env_names(meta: Mapping[str, Any]) -> list[str]:
    """The members of the env mix a report's `meta` (env, env_kwargs) names; [] for one env."""
    if meta.get("env") != MIX_ENV:
        return []
    return [member_name(entry) for entry in meta.get("env_kwargs", {}).get("envs", [])]


def categories(results: Mapping[str, Sequence[TaskResult]]) -> list[str]:
    """The tasks' categories, sorted; [] when no task has one."""
    found = {r.category for rs in results.values() for r in rs if r.category is not None}
    return sorted(found)


def build_report(
    results: Mapping[str, Sequence[TaskResult]],
    *,
    k: int = 1,
    comparisons: Sequence[tuple[str, str]] = (),
    meta: Mapping[str, Any] | None = None,
) -> Report:
    """The report of one or more models on the same tasks: each model's `summarize`,
    `compare(a, b)` as "<a> - <b>" for each pair in `comparisons`, the per-task
    `task_records`. On an env mix (`meta` names it), each model and comparison also
    per member, over its tasks: "<model> (<env>)", "<a> - <b> (<env>)"; where tasks have
    categories, also per category: "<model> / <category>", "<a> - <b> / <category>"."""
    meta = dict(meta or {})
    groups = {"": results}
    for env in env_names(meta):
        mine = {m: [r for r in rs if r.task_id.startswith(f"{env}:")] for m, rs in results.items()}
        if all(mine.values()):
            groups[f" ({env})"] = mine
    for category in categories(results):
        mine = {m: [r for r in rs if r.category == category] for m, rs in results.items()}
        if all(mine.values()):
            groups[f" / {category}"] = mine
    return Report(
        meta=meta,
        models={
            f"{name}{g}": summarize(r, k) for g, rs in groups.items() for name, r in rs.items()
        },
        comparisons={
            f"{a} - {b}{g}": compare(rs[a], rs[b])
            for g, rs in groups.items()
            for a, b in comparisons
        },
        tasks={name: task_records(r) for name, r in results.items()},
    )


def _cell(value: float | None) -> str:
    return (
        "n/a"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else (f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}")
    )


def _at_k(summary: ModelSummary) -> dict[str, float]:
    return summary.sampled.at_k if summary.sampled is not None else {}


def table_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the report's table: one row per model, greedy figures then sampled."""
    models = report.models
    sampled = sorted({key for m in models.values() for key in _at_k(m)})
    header = ["model", "tasks", *(h for _, h in TABLE_COLUMNS), *sampled]
    rows = []
    for name, m in models.items():
        greedy = m.greedy.to_json()
        row = [name, str(m.tasks), *(_cell(greedy[key]) for key, _ in TABLE_COLUMNS)]
        rows.append(row + [_cell(_at_k(m).get(key)) for key in sampled])
    return header, rows


def comparison_lines(report: Report) -> list[str]:
    """One line per comparison: the mean per-task difference and its bootstrap interval."""
    lines = []
    labels = {
        "correctness_strict": "greedy correctness (strict)",
        "correctness_lenient": "greedy correctness (lenient)",
        "pass@1": "sampled pass@1 (strict)",
    }
    for name, c in report.comparisons.items():
        for key, label in labels.items():
            if key not in c.intervals:
                continue
            d = c.intervals[key]
            lines.append(
                f"{name}: {label} {d.diff:+.3f}, "
                f"{c.level:.0%} bootstrap interval [{d.low:+.3f}, {d.high:+.3f}] "
                f"over {c.tasks} tasks"
            )
    return lines


def write_report(directory: Path, report: Report) -> list[Path]:
    """Writes report.json, report.md and report.png under `directory`; returns their paths."""
    from agentgym.eval.plots import report_chart

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "report.json", directory / "report.md", directory / "report.png"]
    paths[0].write_text(json.dumps(report.to_json(), indent=1, default=_json_default) + "\n")
    header, rows = table_rows(report)
    md = [f"# Evaluation: {report.meta.get('env', '')}", ""]
    md += [f"- {key}: {value}" for key, value in report.meta.items()] + [""]
    md += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(row) + " |" for row in rows]
    md += ["", *(f"- {line}" for line in comparison_lines(report)), ""]
    md += ["![report](report.png)", ""]
    paths[1].write_text("\n".join(md))
    rates = ("correctness_strict", "correctness_lenient", "format_accuracy")
    figures = {}
    for name, m in report.models.items():
        figures[name] = {key: m.greedy[key] for key in rates} | _at_k(m)
    report_chart(figures, paths[2])
    return paths


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to report.json")
