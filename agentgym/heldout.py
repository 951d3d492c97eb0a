"""Held-out evaluation: play test tasks greedily and by sampling, score them, report.

`HeldOut` plays each task once greedily (temperature 0) and, optionally, n
times at the sampling temperature and top-p, through the same rollout as
training, so an evaluated episode is exactly a training episode without the update.
`summarize` turns the per-task results into the report's figures; the
statistics themselves (pass@k, maj@k, bootstrap) live in `agentgym.evaluate`.

Correctness is judged two ways, side by side:

- strict: the environment's own verdict, which needs the exact format (a
  `\\boxed{}` or `Final Answer:` the env parses, after well-formed tool calls);
- lenient: math-verify equivalence of any final answer found in the last
  assistant message (boxed, `Final Answer:`, or else its last number), so a
  right answer in the wrong format still counts.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentgym.core import make_env
from agentgym.evaluate import maj_at_k, paired_bootstrap, pass_at_k
from agentgym.policy.base import Policy, SamplingParams
from agentgym.policy.hf import merged_adapters
from agentgym.rewards import answers_equal, extract_boxed
from agentgym.rollout import TaskSpec, collect
from agentgym.types import Trajectory

_FINAL_ANSWER = re.compile(r"Final Answer:[ \t]*(.+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_answer(text: str) -> str | None:
    """The answer an assistant message gives: its boxed answer, its `Final Answer:`, or its
    last number; None when it has none of these."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed.strip()
    stated = _FINAL_ANSWER.findall(text)
    if stated:
        return stated[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


@dataclass(frozen=True)
class EpisodeScore:
    """One evaluated episode, reduced to what the report needs."""

    reward: float
    parts: dict[str, float]
    strict: bool
    lenient: bool
    format_ok: bool
    answer: str | None
    turns: int
    tool_calls: float
    tool_errors: float
    completion_length: int
    truncated: bool

    @classmethod
    def of(cls, t: Trajectory, expected: str) -> EpisodeScore:
        last = t.turns[-1].action if t.turns else ""
        answer = final_answer(last)
        return cls(
            reward=t.reward,
            parts=dict(t.reward_parts),
            strict=t.reward_parts.get("correctness", 0.0) >= 1.0,
            lenient=answer is not None and answers_equal(answer, expected),
            format_ok=t.reward_parts.get("format", 0.0) > 0,
            answer=answer,
            turns=len(t.turns),
            tool_calls=t.counts.get("tool_calls", 0.0),
            tool_errors=sum(v for k, v in t.counts.items() if k.startswith("tool_errors/")),
            completion_length=t.completion_length,
            truncated=t.truncated,
        )


@dataclass
class TaskResult:
    """A task's greedy episode and its sampled ones."""

    task_id: str
    expected: str
    greedy: EpisodeScore
    samples: list[EpisodeScore] = field(default_factory=list)


def task_result(data: dict[str, Any]) -> TaskResult:
    """A TaskResult from its `dataclasses.asdict` form (as a checkpoint stores it)."""
    return TaskResult(data["task_id"], data["expected"], EpisodeScore(**data["greedy"]),
                      [EpisodeScore(**s) for s in data["samples"]])  # fmt: skip


def held_out_ids(env_id: str, env_kwargs: dict[str, Any], count: int, *, start: int = 0,
                 split: str = "test") -> list[str]:  # fmt: skip
    """Task ids `start .. start + count` of `split` (all there are, when fewer).

    Raises:
        ValueError: when the split has no task at `start`.
    """
    env = make_env(env_id, **env_kwargs)
    try:
        agent = env.unwrapped
        total = agent.num_tasks(split)
        if start >= total:
            raise ValueError(
                f"{env_id}: the {split!r} split has {total} tasks; none from index {start}"
            )
        return [agent.task_id(split, i) for i in range(start, min(total, start + count))]
    finally:
        env.close()


class HeldOut:
    """Plays a fixed list of held-out tasks with a policy and scores every episode.

    Args:
        env_id, env_kwargs: The environment, as for `make_env`.
        task_ids: The tasks, played in this order.
        tokenizer: The policy's tokenizer.
        max_new_tokens, max_episode_tokens: The rollout's limits (as in training).
        stop: Strings that end a turn (as in training).
        n: Sampled episodes per task besides the greedy one (0: greedy only).
        temperature, top_p: How those n episodes are sampled: as in training
            (`from_config`), so that pass@k measures the distribution the policy is
            trained to sample from. The greedy episode takes no top-p.
        batch: Most episodes played at once.
    """

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict[str, Any],
        task_ids: Sequence[str],
        tokenizer,
        *,
        max_new_tokens: int,
        max_episode_tokens: int | None = None,
        n: int = 0,
        temperature: float = 1.0,
        top_p: float = 1.0,
        batch: int = 32,
        stop: Sequence[str] = (),
    ):
        if not task_ids:
            raise ValueError("HeldOut needs at least one task id")
        self.task_ids = list(task_ids)
        self.tokenizer = tokenizer
        self.max_new_tokens, self.max_episode_tokens = max_new_tokens, max_episode_tokens
        self.n, self.temperature, self.top_p, self.stop = n, temperature, top_p, tuple(stop)
        self.batch = max(batch, n)
        self.envs = [make_env(env_id, **env_kwargs) for _ in range(self.batch)]
        agent = self.envs[0].unwrapped
        self.expected = {t: str(agent.load_task(t).answer) for t in self.task_ids}

    @classmethod
    def from_config(cls, config, task_ids: Sequence[str], tokenizer, *, n: int) -> HeldOut:
        """`task_ids` played with the run's sampling settings and `eval.max_new_tokens`."""
        s, run = config.sampling, config.run
        return cls(run.env, run.env_kwargs, task_ids, tokenizer, n=n, temperature=s.temperature,
                   top_p=s.top_p, max_new_tokens=config.eval.max_new_tokens or s.max_new_tokens,
                   max_episode_tokens=s.max_episode_tokens, stop=s.stop)  # fmt: skip

    @property
    def episodes(self) -> int:
        """Episodes one `run` plays."""
        return len(self.task_ids) * (1 + self.n)

    def _play(self, policy: Policy, group: int, params: SamplingParams, advance) -> list:
        per_chunk = max(1, self.batch // group)
        out: list[list[Trajectory]] = []
        for start in range(0, len(self.task_ids), per_chunk):
            ids = self.task_ids[start : start + per_chunk]
            specs = [TaskSpec(task_id=t) for t in ids]
            played = collect(self.envs, specs, group, policy, self.tokenizer, params,
                             max_tokens=self.max_episode_tokens)  # fmt: skip
            out += [played[i * group : (i + 1) * group] for i in range(len(ids))]
            advance(len(played))
        return out

    def run(self, policy: Policy, *, seed: int = 0,
            advance: Callable[[int], None] = lambda n: None) -> list[TaskResult]:  # fmt: skip
        """Plays every task; `advance(k)` is called as each k episodes finish."""
        with merged_adapters(getattr(policy, "model", None)):
            return self._run(policy, seed, advance)

    def _run(self, policy: Policy, seed: int, advance: Callable[[int], None]
             ) -> list[TaskResult]:  # fmt: skip
        greedy = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0, stop=self.stop)
        played = self._play(policy, 1, greedy, advance)
        results = [
            TaskResult(t, self.expected[t], EpisodeScore.of(g[0], self.expected[t]))
            for t, g in zip(self.task_ids, played, strict=True)
        ]
        if self.n:
            sampled = SamplingParams(max_new_tokens=self.max_new_tokens, stop=self.stop,
                                     temperature=self.temperature, top_p=self.top_p,
                                     seed=seed)  # fmt: skip
            for result, group in zip(results, self._play(policy, self.n, sampled, advance),
                                     strict=True):  # fmt: skip
                result.samples = [EpisodeScore.of(t, result.expected) for t in group]
        return results

    def close(self) -> None:
        """Closes the environments; a second call does nothing."""
        for env in self.envs:
            env.close()
        self.envs = []


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _episode_figures(scores: Sequence[EpisodeScore]) -> dict[str, Any]:
    calls = sum(s.tool_calls for s in scores)
    parts = sorted({p for s in scores for p in s.parts})
    return {
        "correctness_strict": _mean([float(s.strict) for s in scores]),
        "correctness_lenient": _mean([float(s.lenient) for s in scores]),
        "format_accuracy": _mean([float(s.format_ok) for s in scores]),
        "reward_mean": _mean([s.reward for s in scores]),
        "reward_parts": {p: _mean([s.parts.get(p, 0.0) for s in scores]) for p in parts},
        "turns": _mean([s.turns for s in scores]),
        "tool_calls": _mean([s.tool_calls for s in scores]),
        "tool_error_rate": sum(s.tool_errors for s in scores) / calls if calls else 0.0,
        "completion_length": _mean([s.completion_length for s in scores]),
        "truncated": _mean([float(s.truncated) for s in scores]),
    }


def _vote_key(score: EpisodeScore) -> str | None:
    """The answer as a vote: every answer equivalent to the expected one votes alike."""
    if score.answer is None:
        return None
    return "<expected>" if score.lenient else score.answer.strip()


def summarize(results: Sequence[TaskResult], k: int = 1) -> dict[str, Any]:
    """The report's figures: greedy episode figures, and pass@1, pass@k, maj@k when sampled.

    pass@k counts strict correctness; maj@k votes over the first k sampled
    answers, equivalent answers (math-verify) voting together.
    """
    out: dict[str, Any] = {
        "tasks": len(results),
        "greedy": _episode_figures([r.greedy for r in results]),
    }
    n = min((len(r.samples) for r in results), default=0)
    if n:
        if not 1 <= k <= n:
            raise ValueError(f"k={k}; valid: 1 to n={n}, the samples per task")
        sampled = _episode_figures([s for r in results for s in r.samples])
        correct = [sum(s.strict for s in r.samples) for r in results]
        sampled["pass@1"] = _mean([pass_at_k(n, c, 1) for c in correct])
        sampled[f"pass@{k}"] = _mean([pass_at_k(n, c, k) for c in correct])
        sampled[f"maj@{k}"] = _mean(
            [maj_at_k([_vote_key(s) for s in r.samples], "<expected>", k)
             for r in results]
        )  # fmt: skip
        out.update(n=n, k=k, sampled=sampled)
    return out


def compare(results: Sequence[TaskResult], baseline: Sequence[TaskResult],
            level: float = 0.95) -> dict[str, Any]:  # fmt: skip
    """Per-task correctness differences (model - baseline) with bootstrap intervals: greedy,
    strict and lenient, and pass@1 of the sampled episodes when both have them.

    Raises:
        ValueError: unless both hold the same tasks in the same order.
    """
    ids, base_ids = [r.task_id for r in results], [r.task_id for r in baseline]
    if ids != base_ids:
        raise ValueError("compare() needs both models' results on the same tasks, in order")
    out: dict[str, Any] = {"level": level, "tasks": len(ids)}
    scores = {
        f"correctness_{judge}": lambda r, judge=judge: float(getattr(r.greedy, judge))
        for judge in ("strict", "lenient")
    }
    if all(r.samples for r in (*results, *baseline)):
        scores["pass@1"] = lambda r: _mean([float(s.strict) for s in r.samples])
    for key, score in scores.items():
        diff, low, high = paired_bootstrap([score(r) for r in results],
                                           [score(r) for r in baseline], level=level)  # fmt: skip
        out[key] = {"diff": diff, "low": low, "high": high}
    return out


def task_records(results: Sequence[TaskResult]) -> list[dict[str, Any]]:
    """The per-task results as JSON-ready dicts."""
    return [asdict(r) for r in results]


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
)
"""The greedy figures the printed and markdown tables show, with their headers."""


def build_report(
    results: Mapping[str, Sequence[TaskResult]],
    *,
    k: int = 1,
    comparisons: Sequence[tuple[str, str]] = (),
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The report of one or more models on the same tasks.

    Keys: "meta" (what was evaluated and how), "models" (name -> `summarize`),
    "comparisons" ("<a> - <b>" -> `compare(a, b)` for each pair in
    `comparisons`) and "tasks" (name -> `task_records`).
    """
    report: dict[str, Any] = {
        "meta": dict(meta or {}),
        "models": {name: summarize(r, k) for name, r in results.items()},
        "comparisons": {},
        "tasks": {name: task_records(r) for name, r in results.items()},
    }
    for a, b in comparisons:
        report["comparisons"][f"{a} - {b}"] = compare(results[a], results[b])
    return report


def _cell(value: float) -> str:
    return (
        "n/a"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else (f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}")
    )


def table_rows(report: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the report's table: one row per model, greedy figures then sampled."""
    models = report["models"]
    sampled = sorted({k for m in models.values() for k in m.get("sampled", {})
                      if k.startswith(("pass@", "maj@"))})  # fmt: skip
    header = ["model", "n", *(h for _, h in TABLE_COLUMNS), *sampled]
    rows = []
    for name, m in models.items():
        row = [name, str(m["tasks"]), *(_cell(m["greedy"][key]) for key, _ in TABLE_COLUMNS)]
        rows.append(row + [_cell(m.get("sampled", {}).get(key)) for key in sampled])
    return header, rows


def comparison_lines(report: Mapping[str, Any]) -> list[str]:
    """One line per comparison: the mean per-task difference and its bootstrap interval."""
    lines = []
    labels = {"correctness_strict": "greedy correctness (strict)",
              "correctness_lenient": "greedy correctness (lenient)",
              "pass@1": "sampled pass@1 (strict)"}  # fmt: skip
    for name, c in report["comparisons"].items():
        for key, label in labels.items():
            if key not in c:
                continue
            d = c[key]
            lines.append(
                f"{name}: {label} {d['diff']:+.3f}, "
                f"{c['level']:.0%} bootstrap interval [{d['low']:+.3f}, {d['high']:+.3f}] "
                f"over {c['tasks']} tasks"
            )
    return lines


def write_report(directory: Path, report: Mapping[str, Any]) -> list[Path]:
    """Writes report.json, report.md and report.png under `directory`; returns their paths."""
    from agentgym.plots import report_chart

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "report.json", directory / "report.md", directory / "report.png"]
    paths[0].write_text(json.dumps(report, indent=1, default=_json_default) + "\n")
    header, rows = table_rows(report)
    md = [f"# Evaluation: {report['meta'].get('env', '')}", ""]
    md += [f"- {key}: {value}" for key, value in report["meta"].items()] + [""]
    md += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(row) + " |" for row in rows]
    md += ["", *(f"- {line}" for line in comparison_lines(report)), ""]
    md += ["![report](report.png)", ""]
    paths[1].write_text("\n".join(md))
    rates = ("correctness_strict", "correctness_lenient", "format_accuracy")
    figures = {}
    for name, m in report["models"].items():
        figures[name] = {key: m["greedy"][key] for key in rates}
        figures[name].update({k: v for k, v in m.get("sampled", {}).items()
                              if k.startswith(("pass@", "maj@"))})  # fmt: skip
    report_chart(figures, paths[2])
    return paths


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to report.json")


def run_eval(config, *, n: int, k: int, baseline: str | None, output: Path) -> dict[str, Any]:
    """`agentgym eval`: plays the held-out tasks with the model (and the baseline), writes
    the report under `output`, prints its table; returns the report."""
    from agentgym.console import Stages, print_report
    from agentgym.policy.hf import HFPolicy
    from agentgym.policy.models import load_model_and_tokenizer, resolve_model_name

    ev, run = config.eval, config.run
    ids = held_out_ids(run.env, run.env_kwargs, ev.tasks, split=ev.split)
    names = {"model": config.model.name, **({"baseline": baseline} if baseline else {})}
    results: dict[str, list[TaskResult]] = {}
    with Stages() as stages:
        for role, name in names.items():
            model, tokenizer = load_model_and_tokenizer(name)
            held = HeldOut.from_config(config, ids, tokenizer, n=n)
            try:
                task = stages.stage(f"eval {role}", held.episodes)
                policy = HFPolicy(model, tokenizer)
                advance = lambda count, task=task: stages.advance(task, count)  # noqa: E731
                results[role] = held.run(policy, seed=run.seed, advance=advance)
                figures = summarize(results[role])["greedy"]
                stages.note(task, f"correct {figures['correctness_strict']:.3f}", done=True)
            finally:
                held.close()
        meta = {
            "env": run.env,
            "env_kwargs": run.env_kwargs,
            "split": ev.split,
            **{role: resolve_model_name(name) for role, name in names.items()},
            "n": n,
            "k": k,
            "temperature": config.sampling.temperature,
            "top_p": config.sampling.top_p,
            "max_new_tokens": ev.max_new_tokens or config.sampling.max_new_tokens,
        }
        report = build_report(results, k=k if n else 1,
                              comparisons=[("model", "baseline")] if baseline else (),
                              meta=meta)  # fmt: skip
        write_report(output, report)
        print_report(report, stages.bar.console)
    return report
