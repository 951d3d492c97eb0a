"""Records that cross stages: a step's metrics, declared once, and a checkpoint's state.

Every metric a GRPO step logs is declared here, once, with what it means:
its key (as metrics.jsonl and TensorBoard name it), whether it is a timing
(which varies from run to run, so reproducibility checks leave it out), and
the `curves.png` panel it is drawn on. Producers (the rollout's figures, the
learner, the loop) write their values under these names; the health checks,
the curves and the docs read the declarations. Adding a metric is one
`declare` here and the line that computes it.

`CheckpointState` is `state.json` of a training checkpoint: what the loop needs
to go on exactly where it stopped; `Report` is an evaluation's report.json
(`ModelSummary`, `Figures`, `Comparison`). Imports nothing of agentgym.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class Metric:
    """One metric of a training step."""

    key: str
    description: str
    timing: bool = False
    """Wall-clock figures differ between two runs of the same seed."""
    panel: str | None = None
    """The title of the `curves.png` panel it is drawn on, if any."""


STEP_METRICS: dict[str, Metric] = {}
"""Every declared step metric, by key, in declaration order."""


def declare(key: str, description: str, *, timing: bool = False, panel: str | None = None) -> str:
    """Adds a metric to `STEP_METRICS`; returns its key (a name for producers to write)."""
    if key in STEP_METRICS:
        raise ValueError(f"metric {key!r} is declared twice")
    STEP_METRICS[key] = Metric(key, description, timing, panel)
    return key


REWARD_PANEL, CORRECT_PANEL = "reward (mean ± std)", "correctness (train, held-out)"
KL_PANEL, ENTROPY_PANEL, LENGTH_PANEL = (
    "KL to the reference",
    "entropy",
    "completion length (tokens)",
)
PANELS = (REWARD_PANEL, CORRECT_PANEL, KL_PANEL, ENTROPY_PANEL, LENGTH_PANEL)
"""`curves.png`'s panels, left to right."""

# -- the rollout's figures (the seed tutorial's section 7) --
REWARD_MEAN = declare("reward/mean", "Mean reward of the scorable episodes.", panel=REWARD_PANEL)
REWARD_STD = declare("reward/std", "Their population standard deviation (the panel's band).")
REWARD_MAX = declare("reward/max", "Their highest reward.")
REWARD_MIN = declare("reward/min", "Their lowest reward.")
FORMAT_ACCURACY = declare("format_accuracy", "Share with a positive 'format' reward part.")
CORRECTNESS_RATE = declare(
    "correctness_rate", "Share whose 'correctness' part reached 1.0.", panel=CORRECT_PANEL
)
COMPLETION_LENGTH = declare(
    "avg_completion_length",
    "Mean tokens the policy sampled per episode.",
    panel=LENGTH_PANEL,
)
TRUNCATED_FRACTION = declare("truncated_fraction", "Share cut at the turn or token budget.")
REWARD_FAILED = declare("reward/failed", "Episodes whose reward is not a verified outcome.")
ENV_ERRORS = declare("env/errors", "Episodes that env.reset or env.step ended (raised, hung).")
REWARD_FIRST_ERROR = declare("reward/first_error", "The first such reward's message.")
ENV_FIRST_ERROR = declare("env/first_error", "The first such exception.")
FAILED_FRACTION = declare(
    "failures/fraction",
    "Share of the step's episodes that are unscorable (env.reset or env.step raised or hung, "
    "a reward failed); above run.max_failed_fraction for run.max_failed_steps steps: a stop.",
)
TOOL_CALLS = declare("tools/calls_per_episode", "Tool calls per episode.")
TOOL_ERROR_RATE = declare("tools/error_rate", "Failed tool calls per call.")
SPLIT_SAMPLES = declare(
    "agent/split_samples",
    "Samples beyond the first of the step's episodes: an agent program (run.agent) or the "
    "chat template rewrote the history, and each sample trains with the episode's "
    "advantage, weighted.",
)
TOKENS_CHECKED = declare(
    "tokens/checked",
    "Sampled ids the step's episodes train on, each compared with the id the policy sampled "
    "at its turn (every sample of every episode, the agent endpoint's too).",
)
TOKENS_RESAMPLED = declare(
    "tokens/resampled",
    "Of those, the ids that differ: trained on but not sampled (re-tokenised). 0; any other "
    "count is an error naming the episode and the turn.",
)
ENV_PREFIX = "env/"
"""Figures of one member of an env mix (`run.envs`): env/<name>/reward/mean and
env/<name>/correctness_rate."""


def env_metric(name: str, metric: str) -> str:
    """The key of `metric` over the episodes of the env mix's member `name`."""
    return f"{ENV_PREFIX}{name}/{metric}"


CATEGORY_PREFIX = "category/"
"""Figures of the episodes of one task category (a data file's `category_column`,
FunctionCalls-v0's kinds): category/<label>/reward/mean and category/<label>/correctness_rate."""


def category_metric(label: str, metric: str) -> str:
    """The key of `metric` over the episodes of tasks of category `label`."""
    return f"{CATEGORY_PREFIX}{label}/{metric}"


BENCH_PREFIX = "bench/"
"""Held-out figures of the public benchmarks a run plays (`eval.benchmarks`):
bench/<benchmark>/correctness (the mean of its categories) and
bench/<benchmark>/<category>/correctness, each the greedy share the benchmark's checker
passed."""


def bench_metric(path: str) -> str:
    """The key of a benchmark figure: `path` is <benchmark>[/<category>]."""
    return f"{BENCH_PREFIX}{path}/correctness"


TOOL_ERRORS_PREFIX = "tools/error_rate/"
"""Failed calls per call of one kind: tools/error_rate/<kind> (unknown_tool, ...)."""
REWARD_PENALISED = declare("reward/penalised_mean", "Mean reward after grpo.length_penalty.")
ZERO_VARIANCE = declare("zero_variance_groups", "Share of groups whose rewards were all equal.")
DROPPED_GROUPS = declare("dropped_groups", "Groups left out (grpo.drop_zero_variance_groups).")
RESAMPLE_ROUNDS = declare(
    "grpo/resample_rounds", "Extra rounds of tasks the step sampled (grpo.dynamic_sampling)."
)
INFORMATIVE_GROUPS = declare(
    "grpo/informative_groups",
    "Groups with differing rewards the step trained on, of tasks_per_step (dynamic_sampling).",
)

# -- the learner --
LOSS = declare(
    "loss/policy",
    "The clipped surrogate, aggregated as the loss option says; the loss minimised is it "
    "plus beta x kl.",
)
KL = declare("kl", "The k3 (or chosen) estimate of KL to the reference.", panel=KL_PANEL)
CLIP_FRACTION = declare("clip_fraction", "Share of trained tokens whose ratio was clipped.")
ENTROPY = declare(
    "entropy", "Mean entropy of the policy on the trained tokens.", panel=ENTROPY_PANEL
)
GRAD_NORM = declare("grad_norm", "Gradient norm before clipping.")
LR = declare("lr", "The learning rate of the step.")
SKIPPED = declare("skipped", "1 when the update was skipped (a non-finite loss or gradient).")
BETA = declare("beta", "The KL coefficient of the step (grpo.beta's schedule).")
LOGPROB_DIFF_MAX = declare("rollout/logprob_diff_max", "Largest |learner - sampler| logprob.")
IS_RATIO_MEAN = declare("rollout/is_ratio_mean", "Mean truncated importance weight (vLLM).")
IS_TRUNCATED = declare("rollout/is_truncated_fraction", "Share of weights cut at grpo.tis_cap.")
SKIPPED_STEPS = declare("train/skipped_steps", "Skipped updates so far in the run.")
CURRICULUM_LEVEL = declare(
    "curriculum/level", "Difficulty level of the step's train tasks (run.curriculum)."
)

# -- the weight sync --
WEIGHT_SYNC_SECONDS = declare(
    "rollout/weight_sync_seconds", "Copying weights into the run's policy.", timing=True
)
SYNC_SECONDS = declare("rollout/sync_seconds", "Sending weights to the Ray workers.", timing=True)
WORKER_RESTARTS = declare("rollout/worker_restarts", "Ray worker restarts so far.")
SYNC_PATH = declare("rollout/sync_path", "How the last sync went (object_store, collective).")

# -- asynchronous GRPO (pipeline.max_off_policy_steps > 0) --
STALENESS_MEAN = declare(
    "async/staleness_mean", "Mean versions the trained episodes' oldest tokens were behind."
)
STALENESS_MAX = declare("async/staleness_max", "Most versions a trained episode was behind.")
STALE_GROUPS = declare(
    "async/dropped_groups", "Groups left untrained: more than k versions behind."
)

# -- time --
STEP_SECONDS = declare("step_seconds", "Wall-clock seconds of the step.", timing=True)
ROLLOUT_SECONDS = declare("rollout_seconds", "Of which playing the episodes.", timing=True)
TOKENS_PER_SECOND = declare("tokens_per_second", "Trained tokens per second.", timing=True)

# -- held-out evaluations, on the steps they run --
EVAL_CORRECTNESS = declare(
    "eval/correctness", "Held-out greedy correctness (strict).", panel=CORRECT_PANEL
)
EVAL_PASS_AT_1 = declare("eval/pass@1", "Held-out sampled pass@1.", panel=CORRECT_PANEL)
EVAL_LENIENT = declare("eval/correctness_lenient", "Held-out greedy correctness (lenient).")
EVAL_FORMAT = declare("eval/format_accuracy", "Held-out greedy format accuracy.")
EVAL_REWARD = declare("eval/reward_mean", "Held-out greedy mean reward.")
EVAL_TOOL_ERRORS = declare("eval/tool_error_rate", "Held-out greedy tool error rate.")

TIMING = frozenset(key for key, metric in STEP_METRICS.items() if metric.timing)
"""The step metrics that differ between two runs of the same seed."""


def panels() -> list[tuple[tuple[str, ...], str]]:
    """`curves.png`'s panels: (keys in declaration order, title), in `PANELS` order."""
    found: dict[str, list[str]] = {title: [] for title in PANELS}
    for metric in STEP_METRICS.values():
        if metric.panel is not None:
            found[metric.panel].append(metric.key)
    return [(tuple(keys), title) for title, keys in found.items()]


@dataclass
class CheckpointState:
    """`state.json` of a training checkpoint: where the GRPO loop stands.

    `history` is the metrics of every step so far; `rng` the Python, NumPy
    and run generators' states; `evals` the held-out results so far, by stage.
    """

    step: int
    start_model: str | None
    history: list[dict[str, Any]] = field(default_factory=list)
    best_step: int | None = None
    skipped_steps: int = 0
    consecutive_skips: int = 0
    rng: dict[str, Any] = field(default_factory=dict)
    evals: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    start_selection: dict[str, Any] | None = None
    """The start model's held-out selection figures (step 0), a `checkpoint-best` candidate."""

    def to_json(self) -> dict[str, Any]:
        """The JSON object, with the keys in the order state.json has always had."""
        return {
            "step": self.step,
            "start_model": self.start_model,
            "history": self.history,
            "best_step": self.best_step,
            "skipped_steps": self.skipped_steps,
            "consecutive_skips": self.consecutive_skips,
            "rng": self.rng,
            "evals": self.evals,
        } | ({} if self.start_selection is None else {"start_selection": self.start_selection})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckpointState:
        """Reads a training checkpoint's state.json (KeyError names a missing field)."""
        return cls(
            step=data["step"],
            start_model=data["start_model"],
            history=data["history"],
            best_step=data["best_step"],
            skipped_steps=data["skipped_steps"],
            consecutive_skips=data["consecutive_skips"],
            rng=data["rng"],
            evals=data.get("evals", {}),
            start_selection=data.get("start_selection"),  # older checkpoints: none
        )


class JsonView(Mapping[str, Any]):
    """A record reads like the JSON object it writes, as a read-only mapping (for code
    that read the dicts these records replaced); attributes are the typed way in."""

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())


@dataclass(frozen=True)
class Figures(JsonView):
    """A model's figures over a set of held-out episodes (its greedy ones, or its samples).

    Rates are shares of episodes, `tool_error_rate` failed calls per call, `turns`,
    `tool_calls` and `completion_length` means per episode. `at_k` holds the sampled
    episodes' pass@1, pass@k and maj@k, under those names, as report.json writes them.
    """

    correctness_strict: float
    correctness_lenient: float
    format_accuracy: float
    reward_mean: float
    reward_parts: dict[str, float]
    turns: float
    tool_calls: float
    tool_error_rate: float
    completion_length: float
    truncated: float
    unscorable: float = 0.0
    """Share of episodes that could not be scored (the environment raised or hung); the
    rates above are over the others, so such an episode is not counted as a wrong answer."""
    at_k: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "at_k"}
        return {**out, **self.at_k}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Figures:
        names = [f.name for f in fields(cls) if f.name != "at_k"]
        at_k = {key: value for key, value in data.items() if key not in names}
        given = {name: data[name] for name in names if name != "unscorable"}
        return cls(**given, unscorable=data.get("unscorable", 0.0), at_k=at_k)  # older: none


@dataclass(frozen=True)
class ModelSummary(JsonView):
    """One model's line of a report: its greedy figures on `tasks` tasks and, when it
    sampled `n` episodes per task, their figures with pass@k and maj@k at `k`."""

    tasks: int
    greedy: Figures
    n: int = 0
    k: int = 1
    sampled: Figures | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tasks": self.tasks, "greedy": self.greedy.to_json()}
        if self.sampled is not None:
            out.update(n=self.n, k=self.k, sampled=self.sampled.to_json())
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelSummary:
        sampled = data.get("sampled")
        return cls(
            tasks=data["tasks"],
            greedy=Figures.from_json(data["greedy"]),
            n=data.get("n", 0),
            k=data.get("k", 1),
            sampled=Figures.from_json(sampled) if sampled is not None else None,
        )


@dataclass(frozen=True)
class Interval(JsonView):
    """A mean per-task difference and its bootstrap interval."""

    diff: float
    low: float
    high: float

    def to_json(self) -> dict[str, Any]:
        return {"diff": self.diff, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class Comparison(JsonView):
    """Two models on the same `tasks` tasks: per figure (correctness_strict,
    correctness_lenient, and pass@1 when both sampled), the difference at `level`."""

    level: float
    tasks: int
    intervals: dict[str, Interval]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"level": self.level, "tasks": self.tasks}
        return out | {key: i.to_json() for key, i in self.intervals.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Comparison:
        intervals = {
            key: Interval(**value) for key, value in data.items() if key not in ("level", "tasks")
        }
        return cls(level=data["level"], tasks=data["tasks"], intervals=intervals)


@dataclass(frozen=True)
class Report(JsonView):
    """report.json: what was evaluated and how (`meta`), each model's summary, the
    comparisons ("<a> - <b>"), and each model's per-task results."""

    meta: dict[str, Any]
    models: dict[str, ModelSummary]
    comparisons: dict[str, Comparison]
    tasks: dict[str, list[dict[str, Any]]]

    def to_json(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "models": {name: m.to_json() for name, m in self.models.items()},
            "comparisons": {name: c.to_json() for name, c in self.comparisons.items()},
            "tasks": self.tasks,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        return cls(
            meta=data["meta"],
            models={name: ModelSummary.from_json(m) for name, m in data["models"].items()},
            comparisons={name: Comparison.from_json(c) for name, c in data["comparisons"].items()},
            tasks=data["tasks"],
        )


def metrics_markdown() -> str:
    """docs/metrics.md: every step metric, from its declaration."""
    lines = [
        "<!-- generated by `python -m agentgym.records`: edit agentgym/records.py -->",
        "# The metrics of a training step",
        "",
        "One row of `metrics.jsonl` (and one TensorBoard scalar each) per GRPO step. Timings",
        "differ between two runs of the same seed; everything else is reproducible.",
        "",
        "| key | meaning | timing | curves.png panel |",
        "| --- | --- | --- | --- |",
    ]
    for m in STEP_METRICS.values():
        timing = "yes" if m.timing else ""
        lines.append(f"| `{m.key}` | {m.description} | {timing} | {m.panel or ''} |")
    lines.append(f"| `{TOOL_ERRORS_PREFIX}<kind>` | Failed tool calls of that kind per call. | | |")
    for prefix, what in ((ENV_PREFIX, "member of an env mix"), (CATEGORY_PREFIX, "task category")):
        for metric in (REWARD_MEAN, CORRECTNESS_RATE):
            lines.append(
                f"| `{prefix}<name>/{metric}` | `{metric}` over one {what}'s episodes. | | |"
            )
    for path, what in (("<benchmark>", "mean of its categories"), ("<benchmark>/<category>", "")):
        meaning = "Held-out greedy share a public benchmark's own checker passed"
        meaning += f" ({what})." if what else " (`eval.benchmarks`)."
        lines.append(f"| `{bench_metric(path)}` | {meaning} | | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(metrics_markdown(), end="")
