"""The field's benchmarks, offline: BFCL v4, ToolTalk and τ²-bench as `agentgym eval
--benchmark NAME[:categories][@n]` and as `eval.benchmarks` in a run.

Each benchmark is played by agentgym environments that read its published data from its
package and score episodes with its published checker (`agentgym.envs.bfcl`, `.tooltalk`,
`.tau2`); this module only chooses the tasks and names what was played. The environments
get the benchmark's own keyword arguments (`benchmark=True`: the `test` split is every
published task of the categories asked for), never the run's `run.env_kwargs` or reward
weights, so no training configuration reaches a benchmark's figures; what scored them (the
package's version, each environment's `scoring`) is recorded beside them.

`@n` plays a seeded subset: n tasks of each category (all of a smaller one), drawn with a
seed of their own (`SUBSET_SEED`), kept in the published order; the same `@n` is the same
tasks in every run and every release of agentgym with the same data.
"""

from __future__ import annotations

import importlib.metadata
import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from agentgym import records
from agentgym.env.core import AgentEnv, make_env
from agentgym.eval.heldout import HeldOut, TaskResult
from agentgym.extras import EXTRAS, require
from agentgym.records import bench_metric
from agentgym.rewards.bfcl import CATEGORIES as BFCL_CATEGORIES

BATCH_CHARS = 120_000
"""Characters of openings played at once (about 30k tokens): see `BenchmarkPart.batch`."""

SUBSET_SEED = 0
"""The seed of every `@n` subset (not the run's: a benchmark's tasks do not move with it)."""


@dataclass(frozen=True)
class Benchmark:
    """A benchmark: which environment plays each of its categories, and which it plays by
    default."""

    name: str
    module: str
    """The top-level module of its data package (`agentgym.extras` names its extra)."""
    envs: Mapping[str, str]
    """Each category, by the benchmark's own name, -> the environment id that plays it."""
    defaults: tuple[str, ...]
    """The categories `NAME` alone plays."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments every one of its environments gets (besides categories, benchmark)."""
    episode_tokens: int = 16384
    """The token budget of one episode, when `sampling.max_episode_tokens` is smaller: a
    benchmark's prompts (ToolTalk's 28 API documents are ~7k tokens) and dialogues are
    longer than a training run's; a model's own context may still be shorter."""

    @property
    def package(self) -> str:
        """The data package's name on the index."""
        return EXTRAS[self.module][1] if self.module in EXTRAS else self.module

    def version(self) -> str:
        """The installed data package's version."""
        return importlib.metadata.version(self.package)


BFCL_SINGLE = BFCL_CATEGORIES  # those BFCL scores with its AST checker, or as irrelevance
BFCL_MULTI = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)

BENCHMARKS: dict[str, Benchmark] = {
    "bfcl": Benchmark(
        "bfcl",
        "bfcl_eval",
        {
            **{c: "agentgym/BFCL-v0" for c in BFCL_SINGLE},
            **{c: "agentgym/BFCLMultiTurn-v0" for c in BFCL_MULTI},
        },
        defaults=(*BFCL_SINGLE, "multi_turn_base"),
    ),
    "tooltalk": Benchmark(
        "tooltalk",
        "tooltalk",
        {"easy": "agentgym/ToolTalk-v0", "tooltalk": "agentgym/ToolTalk-v0"},
        defaults=("easy", "tooltalk"),
    ),
    "tau2": Benchmark(
        "tau2",
        "tau2",
        {d: "agentgym/Tau2-v0" for d in ("airline", "retail", "mock")},
        defaults=("airline", "retail"),  # telecom needs an LLM user with tools (Tau2Env)
    ),
}
"""The benchmarks `--benchmark` names."""

_SPEC = re.compile(r"^(?P<name>[a-z0-9_]+)(?::(?P<cats>[A-Za-z0-9_,]+))?(?:@(?P<n>\d+))?$")


@dataclass(frozen=True)
class BenchmarkChoice:
    """A benchmark as `--benchmark` names it: which categories, how many tasks of each."""

    benchmark: Benchmark
    categories: tuple[str, ...]
    n: int | None
    """Tasks per category; None: all of them."""

    @property
    def label(self) -> str:
        cats = ",".join(self.categories)
        return f"{self.benchmark.name}:{cats}" + (f"@{self.n}" if self.n is not None else "")


def parse_benchmark(spec: str) -> BenchmarkChoice:
    """`bfcl`, `bfcl:multi_turn_base`, `tooltalk@20`, `bfcl:simple_python,multiple@50`.

    Raises:
        ValueError: naming what is wrong and what would be valid.
    """
    found = _SPEC.match(spec)
    if found is None:
        raise ValueError(
            f"benchmark {spec!r}: write NAME[:CATEGORY,...][@N] (e.g. bfcl:multi_turn_base@20)"
        )
    name = found["name"]
    if name not in BENCHMARKS:
        raise ValueError(f"benchmark {spec!r}: unknown {name!r}; valid: {', '.join(BENCHMARKS)}")
    bench = BENCHMARKS[name]
    cats = tuple(found["cats"].split(",")) if found["cats"] else bench.defaults
    unknown = [c for c in cats if c not in bench.envs]
    if unknown or len(set(cats)) != len(cats):
        bad = ", ".join(unknown) or "a category named twice"
        raise ValueError(f"benchmark {spec!r}: {bad}; {name}'s categories: {', '.join(bench.envs)}")
    n = int(found["n"]) if found["n"] is not None else None
    if n == 0:
        raise ValueError(f"benchmark {spec!r}: @0 plays nothing; write @N with N >= 1")
    return BenchmarkChoice(bench, cats, n)


def subset(ids: Sequence[str], n: int | None, key: str) -> list[str]:
    """`n` of `ids` drawn with `SUBSET_SEED` and `key` (the benchmark and category), in
    their published order; all of them when `n` is None or at least their number."""
    if n is None or n >= len(ids):
        return list(ids)
    chosen = set(random.Random(f"{SUBSET_SEED}/{key}").sample(range(len(ids)), n))
    return [t for i, t in enumerate(ids) if i in chosen]


@dataclass
class BenchmarkPart:
    """The tasks one environment plays for a benchmark choice."""

    choice: BenchmarkChoice
    env_id: str
    env_kwargs: dict[str, Any]
    task_ids: list[str]
    categories: dict[str, str]
    """Each task id -> its category, by the benchmark's name."""
    scoring: dict[str, Any]
    """The environment's `scoring`: the exact scoring configuration."""
    opening_chars: int = 0
    """The longest opening (messages and tool schemas, as JSON) of its categories' first
    tasks: how many episodes are played at once follows from it (`batch`)."""

    @property
    def batch(self) -> int:
        """Episodes played at once: 32, fewer where openings are long, so a prefill of
        long prompts stays within memory (BFCL multi-turn's and τ² airline's openings are
        ~10k tokens; 20 at once took 17 GB on the CPU)."""
        return max(1, min(32, BATCH_CHARS // max(1, self.opening_chars)))


def plan(choice: BenchmarkChoice) -> list[BenchmarkPart]:
    """The environments and tasks `choice` plays; a missing data package is named with its
    install command before anything loads."""
    bench = choice.benchmark
    require(bench.module, f"--benchmark {bench.name}")
    parts = []
    for env_id in dict.fromkeys(bench.envs[c] for c in choice.categories):
        cats = [c for c in choice.categories if bench.envs[c] == env_id]
        kwargs = {**bench.kwargs, "categories": cats, "benchmark": True}
        ids: list[str] = []
        where: dict[str, str] = {}
        scoring: dict[str, Any] = {}
        longest = 0
        for cat in cats:
            env = make_env(env_id, **{**kwargs, "categories": [cat]})
            try:
                agent = cast(AgentEnv, env.unwrapped)
                every = [agent.task_id("test", i) for i in range(agent.num_tasks("test"))]
                scoring = dict(getattr(agent, "scoring", {}))
                chosen = subset(every, choice.n, f"{bench.name}/{cat}")
                longest = max(longest, _opening_chars(env, chosen[0]))
            finally:
                env.close()
            ids += chosen
            where.update(dict.fromkeys(chosen, cat))
        parts.append(BenchmarkPart(choice, env_id, kwargs, ids, where, scoring, longest))
    return parts


def _opening_chars(env, task_id: str) -> int:
    """The size of a task's opening: its first observation and tool schemas, as JSON."""
    observation, info = env.reset(options={"split": "test", "task_id": task_id})
    return len(json.dumps(observation, default=str)) + len(json.dumps(info.get("tools") or []))


def held_out(part: BenchmarkPart, tokenizer, config) -> HeldOut:
    """`part`'s tasks as a greedy `HeldOut` (a benchmark's figure is its greedy episode),
    with the run's turn limits and stop strings and the budget `episode_tokens` gives."""
    s = config.sampling
    return HeldOut(
        part.env_id,
        part.env_kwargs,
        part.task_ids,
        tokenizer,
        max_new_tokens=config.eval.max_new_tokens or s.max_new_tokens,
        max_episode_tokens=episode_tokens(part.choice.benchmark, config),
        stop=s.stop,
        batch=min(part.batch, len(part.task_ids)),
    )


def episode_tokens(bench: Benchmark, config) -> int:
    """An episode's token budget on `bench`: the larger of the run's and the benchmark's."""
    return max(config.sampling.max_episode_tokens, bench.episode_tokens)


def labelled(part: BenchmarkPart, results: list[TaskResult]) -> list[TaskResult]:
    """`results` with each category written `<benchmark>/<category>`, as reports show it."""
    for r in results:
        r.category = f"{part.choice.benchmark.name}/{part.categories[r.task_id]}"
    return results


def describe(parts: Sequence[BenchmarkPart]) -> dict[str, Any]:
    """What a report records of the benchmarks it played: per benchmark its package and
    version, the categories, `@n` and its seed, and per environment its keyword arguments
    and exact scoring configuration."""
    out: dict[str, Any] = {}
    for part in parts:
        bench = part.choice.benchmark
        entry = out.setdefault(
            part.choice.label,
            {
                "package": bench.package,
                "version": bench.version(),
                "categories": list(part.choice.categories),
                "n": part.choice.n,
                "subset_seed": SUBSET_SEED,
                "envs": {},
            },
        )
        entry["envs"][part.env_id] = {
            "env_kwargs": part.env_kwargs,
            "tasks": len(part.task_ids),
            "scoring": part.scoring,
        }
    return out


def figures(results: Sequence[TaskResult]) -> dict[str, float]:
    """Greedy correctness per `<benchmark>/<category>` and per benchmark (the mean of its
    categories, as BFCL averages its categories), keyed as step metrics (`bench_metric`)."""
    by_cat: dict[str, list[float]] = {}
    for r in results:
        assert r.category is not None  # labelled
        by_cat.setdefault(r.category, []).append(float(r.greedy.strict))
    out = {bench_metric(c): sum(v) / len(v) for c, v in by_cat.items()}
    per_bench: dict[str, list[float]] = {}
    for c, v in by_cat.items():
        per_bench.setdefault(c.partition("/")[0], []).append(sum(v) / len(v))
    out |= {bench_metric(b): sum(v) / len(v) for b, v in per_bench.items()}
    return out


SELECTABLE = (
    "eval/correctness",
    "eval/correctness_lenient",
    "eval/format_accuracy",
    "eval/reward_mean",
)
"""The held-out figures `eval.select_by` may name besides the benchmarks' (higher is better)."""


def selectable(choices: Sequence[BenchmarkChoice], *, sampled: bool) -> list[str]:
    """The metrics `eval.select_by` may name in a run playing `choices` (`sampled`: eval.n >
    0, so eval/pass@1 is logged)."""
    keys = [*SELECTABLE, *([records.EVAL_PASS_AT_1] if sampled else [])]
    for c in choices:
        name = c.benchmark.name
        keys += [bench_metric(name), *(bench_metric(f"{name}/{cat}") for cat in c.categories)]
    return list(dict.fromkeys(keys))
