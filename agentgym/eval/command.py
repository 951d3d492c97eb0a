"""`agentgym eval`: held-out play of a model (and a baseline), its report and table."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from agentgym.eval.benchmarks import describe, episode_tokens, labelled, parse_benchmark, plan
from agentgym.eval.benchmarks import held_out as benchmark_held_out
from agentgym.eval.episode_files import write_episodes
from agentgym.eval.heldout import HeldOut, TaskResult, held_out_ids
from agentgym.eval.report import build_report, summarize, write_report
from agentgym.records import Report
from agentgym.rollout.player import PlayerFactory, turn_player
from agentgym.types import Trajectory


def run_eval(
    config, *, k: int, baseline: str | None, output: Path, players: PlayerFactory = turn_player
) -> Report:
    """`agentgym eval`: plays the held-out tasks with the model (and the baseline), writes
    the report under `output`, prints its table; returns the report. `players(config,
    tokenizer)` gives each model's player (`agentgym.scale.players.make_player`: as a run
    plays its episodes).

    Each task is played once greedily and `config.eval.n` more times sampled (`--n`);
    `k` is pass@k's and maj@k's.
    """
    from agentgym.policy.models import resolve_model_name

    ev, run = config.eval, config.run
    n = ev.n
    ids = held_out_ids(run.env, run.env_kwargs, ev.tasks, split=ev.split)
    names = {"model": config.model.name, **({"baseline": baseline} if baseline else {})}

    def held_out(tokenizer) -> list[tuple[HeldOut, Callable]]:
        held = HeldOut.from_config(config, ids, tokenizer, n=n, player=players(config, tokenizer))
        return [(held, lambda results: results)]

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
        **({"agent": run.agent} if run.agent else {}),
    }
    return _evaluate(config, names, held_out, meta, k=k if n else 1, output=output)


def run_benchmarks(config, *, baseline: str | None, output: Path) -> Report:
    """`agentgym eval --benchmark`: plays `eval.benchmarks` greedily with the model (and the
    baseline) by the turn loop, on the benchmarks' own environments and scoring (nothing
    of `run.env_kwargs` or the rewards); writes and prints the report, one row per
    benchmark category; returns it."""
    from agentgym.policy.models import resolve_model_name

    parts = [p for spec in config.eval.benchmarks for p in plan(parse_benchmark(spec))]
    names = {"model": config.model.name, **({"baseline": baseline} if baseline else {})}
    s = config.sampling

    def held_out(tokenizer) -> list[tuple[HeldOut, Callable]]:
        return [
            (benchmark_held_out(p, tokenizer, config), lambda rs, p=p: labelled(p, rs))
            for p in parts
        ]

    meta = {
        "benchmarks": describe(parts),
        **{role: resolve_model_name(name) for role, name in names.items()},
        "temperature": 0.0,
        "max_new_tokens": config.eval.max_new_tokens or s.max_new_tokens,
        "max_episode_tokens": {
            p.choice.label: episode_tokens(p.choice.benchmark, config) for p in parts
        },
    }
    return _evaluate(config, names, held_out, meta, k=1, output=output)


def _evaluate(
    config,
    names: dict[str, str],
    held_out: Callable[[Any], list[tuple[HeldOut, Callable]]],
    meta: dict[str, Any],
    *,
    k: int,
    output: Path,
) -> Report:
    """Plays each model's `held_out(tokenizer)` sets (each with what labels its results),
    saves its episodes, and writes and prints the report."""
    from agentgym.eval.console import Stages, print_report
    from agentgym.policy.hf import HFPolicy
    from agentgym.policy.models import load_configured, place

    results: dict[str, list[TaskResult]] = {}
    m = config.model
    with Stages() as stages:
        for role, name in names.items():
            model, tokenizer = load_configured(name, m)
            model = place(model, m)  # the model and the baseline alike
            greedy: list[Trajectory] = []
            sampled: list[Trajectory] = []
            results[role] = []
            for held, label in held_out(tokenizer):
                try:
                    task = stages.stage(f"eval {role}", held.episodes)
                    policy = HFPolicy(model, tokenizer)
                    advance = lambda count, task=task: stages.advance(task, count)  # noqa: E731
                    mine: list[Trajectory] = []
                    got = label(
                        held.run(policy, seed=config.run.seed, advance=advance, episodes=mine)
                    )
                    figures = summarize(got).greedy
                    stages.note(task, f"correct {figures.correctness_strict:.3f}", done=True)
                finally:
                    held.close()
                results[role] += got
                greedy += mine[: len(got)]  # each task's greedy episode, then the sampled
                sampled += mine[len(got) :]
            path = output / f"episodes-{role}.npz"
            save_episodes(path, greedy + sampled, len(greedy), config, name, tokenizer)
        comparisons = [("model", "baseline")] if "baseline" in names else ()
        report = build_report(results, k=k, comparisons=comparisons, meta=meta)
        write_report(output, report)
        print_report(report, stages.bar.console)
    return report


def save_episodes(
    path: Path, played: list[Trajectory], greedy: int, config, model: str, tokenizer
) -> None:
    """Writes the episodes `eval.save_episodes` names (all, the failures: not fully correct,
    or unscorable; none) of those `model` played, in the order played (the first `greedy`
    greedily, then each task's `eval.n` sampled ones; each labelled), with each token's
    text."""
    which = config.eval.save_episodes
    if which == "none":
        return
    n = config.eval.n  # each task's sampled episodes follow the greedy ones, task by task
    labels = [{"greedy": True, "sample": 0} for _ in range(greedy)]
    labels += [{"greedy": False, "sample": i % n} for i in range(len(played) - greedy)]
    if which == "failures":
        failed = [not t.scorable or t.reward_parts.get("correctness", 0) < 1 for t in played]
        played = [t for t, f in zip(played, failed, strict=True) if f]
        labels = [x for x, f in zip(labels, failed, strict=True) if f]
    max_bytes = int(config.run.episode_max_mb * (1 << 20))
    decode = lambda i: tokenizer.decode([i])  # noqa: E731
    extra = {"model": model}
    write_episodes(path, played, max_bytes=max_bytes, extra=extra, decode=decode, labels=labels)


def as_trained(config, named_env: bool):
    """`agentgym eval` of a checkpoint: the run's environment and its options (`run.env`,
    `run.env_kwargs`, from the checkpoint's config.yaml), said in one line, unless the
    command named an environment (`named_env`: --env, --config, or a `run.env*` key)."""
    from agentgym.config import ConfigError, load_config

    saved = Path(config.model.name or "") / "config.yaml"
    if named_env or not config.model.name or not saved.is_file():
        return config
    try:
        trained = load_config(saved).run
    except ConfigError:
        return config  # not a run's checkpoint config: the command's own env stands
    print(
        f"agentgym eval: {config.model.name} was trained on {trained.env} "
        f"{trained.env_kwargs or ''}; evaluating there (--env or --config for another)"
    )
    run = config.run.model_copy(update={"env": trained.env, "env_kwargs": trained.env_kwargs})
    return config.model_copy(update={"run": run})


def sized_to_split(config):
    """The config with `eval.tasks` at most what the split holds, said in one line where
    it asked for more; as it is where the environment cannot be made (preflight says why)."""
    from agentgym.env.core import AgentEnv, make_env

    ev = config.eval
    try:
        env = make_env(config.run.env, **config.run.env_kwargs)
    except Exception:  # noqa: BLE001: preflight makes it again and names the problem
        return config
    try:
        total = cast(AgentEnv, env.unwrapped).num_tasks(ev.split)  # make_env made one
    except NotImplementedError:
        return config
    finally:
        env.close()
    if ev.tasks <= total:
        return config
    print(
        f"agentgym eval: eval.tasks {ev.tasks}, but the {ev.split!r} split of "
        f"{config.run.env!r} holds {total}: evaluating all {total}"
    )
    return config.model_copy(update={"eval": ev.model_copy(update={"tasks": total})})
