"""Checks a command's config before any model loads; every problem names its field.

`load_config` checks each field alone: that it exists, its type, its range.
What it cannot see is checked here, for the command about to run: the rules
between fields, and what needs this machine: the environment (made once with
`run.env_kwargs`, then closed), its held-out split and its demonstrations, the
model (found, not loaded) and the output folder. All problems are reported
together, one a line, so a run that would stop after minutes of model loading
stops at once.

The environment is also played up to its first observation, each member of a mix
on its own (a mix's reset reaches only one): its MCP servers are started and list
their tools, it is reset once, and where it has a sandbox (`Code-v0`'s, a
`python` tool's) the sandbox is made and runs one line. Without this, a machine
that cannot isolate code fails every code episode once training is under way, and
an MCP server that cannot start fails at the first reset, after the model loaded.

Only what cannot run as asked is refused: besides what would fail later, a
decaying learning rate whose warm-up fills the whole run (the decay asked
for would never happen). Allowed, because each is well defined:
`eval.every` > `run.steps` (the last step is always evaluated);
`grpo.beta_start` with `grpo.beta_warmup_steps` 0, or the reverse (either
one at its off value switches the schedule off, as `GRPOConfig.beta_at`
reads it); schedules longer than the run (beta's, or a constant learning
rate's warm-up); `grpo.epsilon_high` < `grpo.epsilon` (a narrower upper clip);
`sampling.max_new_tokens` or `eval.max_new_tokens` > `sampling.max_episode_tokens`
(the episode is cut after that turn); `optim.micro_batch_size` larger than the
batch (one micro-batch).

`require_backends` (`require_ray`, `require_vllm`) and `check_torchrun` check what the
backends need of this machine and this launch (installed packages, vLLM's sleep mode,
torchrun's world size); the run calls them before any model loads.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import gymnasium as gym

from agentgym.config import Config, ConfigError
from agentgym.config.rules import broken_rules
from agentgym.env.checker import AgentEnvCheckError, cheap_checks
from agentgym.env.core import AgentEnv, UnknownEnvError, make_env
from agentgym.env.mixture import EnvMix
from agentgym.extras import available, install_hint, require_serve
from agentgym.learn.advantages import unregistered
from agentgym.policy.chat_templates import read_chat_template
from agentgym.policy.models import ModelNotFoundError, check_model_available
from agentgym.rollout.player import load_player
from agentgym.run.curriculum import level_problem
from agentgym.sandboxes import Sandbox, SandboxUnavailableError
from agentgym.scale import ranks
from agentgym.serve.agents import load_agent
from agentgym.tools.mcp import McpServer, McpStartError

logger = logging.getLogger(__name__)
Command = Literal["train", "sft", "eval"]
PROBE_PROGRAM = "print('ok')"
"""The one line a sandbox runs in preflight; it prints "ok" where the sandbox works."""
PROBE_TIMEOUT_S = 30.0  # a first sandbox run on a loaded machine can take seconds


@dataclass(frozen=True)
class Problem:
    """One setting a command cannot run with: its field, what is wrong, what is valid."""

    field: str
    message: str


def check(
    config: Config, command: Command, *, output: Path | None = None, baseline: str | None = None
) -> None:
    """Refuses `config` for `command` unless it can run as configured; loads no model.

    Args:
        config: The whole config, as `load_config` built it.
        command: The command about to run; each checks only what it uses.
        output: `agentgym eval`'s report folder (`--output`); the other commands
            write to `config.run.output`.
        baseline: `agentgym eval`'s second model (`--baseline`), if any.

    Raises:
        ConfigError: naming every problem's field, one a line.
    """
    problems = rule_problems(config, command)
    folder = output if command == "eval" else config.run.output
    if folder is not None:
        problems += _output_problems(
            Path(folder), "--output" if command == "eval" else "run.output"
        )
    models = {"model.name": config.model.name}
    if baseline is not None:
        models["--baseline"] = baseline
    problems += _model_problems(models)
    if config.model.chat_template is not None:
        try:
            read_chat_template(config.model.chat_template)
        except (ValueError, OSError) as err:
            problems.append(Problem("model.chat_template", str(err)))
    benchmarks_only = command == "eval" and bool(config.eval.benchmarks)
    problems += [] if benchmarks_only else _env_problems(config, command)  # theirs: their own
    problems += _benchmark_problems(config, command)
    problems += _player_problems(config)
    if command == "train":
        problems += [
            Problem("run.report_to", f"{name} is not installed: {install_hint(name)}")
            for name in config.run.report_to
            if name != "tensorboard" and not available(name)  # tensorboard: a warning
        ]  # after the env's module, which may register them, is imported
        problems += [Problem(key, why) for key, why in unregistered(config.grpo).items()]
    if problems:
        lines = [f"  {p.field}: {p.message}" for p in problems]
        raise ConfigError("invalid config:\n" + "\n".join(lines))


def rule_problems(config: Config, command: Command) -> list[Problem]:
    """The rules between fields that `command` uses; pure, no I/O."""
    problems = []
    lora, optim = config.lora, config.optim
    if command != "eval" and lora.enabled and not lora.target_modules:
        why = f"{lora.target_modules!r} adapts no module"
        valid = "'all-linear' or a non-empty list of module names"
        problems.append(Problem("lora.target_modules", f"{why}; valid: {valid}"))
    total = config.run.steps * config.grpo.num_iterations
    if command == "train" and optim.lr_scheduler != "constant" and optim.warmup_steps >= total:
        why = (
            f"{optim.warmup_steps} warm-up steps leave none of the run's {total} optimizer "
            f"steps (run.steps x grpo.num_iterations) to the {optim.lr_scheduler} decay"
        )
        valid = f"fewer than {total}, or optim.lr_scheduler: constant"
        problems.append(Problem("optim.warmup_steps", f"{why}; valid: {valid}"))
    if (
        command != "eval"
        and optim.micro_batch_tokens is not None
        and config.model.attn_implementation == "flash_attention_2"
    ):
        why = "packed rows need a block-diagonal attention mask, which flash_attention_2 "
        why += "does not take here"
        valid = "model.attn_implementation sdpa or eager, or optim.micro_batch_tokens: null"
        problems.append(Problem("optim.micro_batch_tokens", f"{why}; valid: {valid}"))
    if (
        command == "train"
        and config.sft.long != "off"
        and not (config.sft.warmup and config.eval.report_tasks)
    ):
        why = "the sft-long row compares with the SFT warm-up in the closing table"
        valid = "sft.warmup: true and eval.report_tasks > 0, or sft.long: off"
        problems.append(Problem("sft.long", f"{why}; valid: {valid}"))
    return problems


def _player_problems(config: Config) -> list[Problem]:
    """Whether `run.agent` names an async function, and `run.player` a player factory, that
    can be imported. They play wherever the run's player does: in this process, on each
    torchrun rank, or on each Ray worker (which imports them as this process does: the
    module must be on the workers' path)."""
    run, problems = config.run, []
    if run.agent is not None:
        require_serve("run.agent (the endpoint an agent calls)")
    for field, path, load in (
        ("run.agent", run.agent, load_agent),
        ("run.player", run.player, load_player),
    ):
        if path is None:
            continue
        try:
            load(path)
        except ValueError as err:
            problems.append(Problem(field, str(err).removeprefix(f"{field} {path!r}: ")))
    return problems


def _output_problems(path: Path, field: str) -> list[Problem]:
    """Whether the folder `path` exists, or can be made, and can be written to."""
    if path.exists() and not path.is_dir():
        return [Problem(field, f"{str(path)!r} is a file; valid: a folder, or a new path")]
    existing = path
    while not existing.exists():  # where mkdir(parents=True) would start
        existing = existing.parent
    if not existing.is_dir():
        return [Problem(field, f"{str(existing)!r} is a file, so {str(path)!r} cannot be made")]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [Problem(field, f"{str(existing)!r} is not writable")]
    return []


def _model_problems(models: dict[str, str | None]) -> list[Problem]:
    problems = []
    for field, name in models.items():
        try:
            check_model_available(name)
        except ModelNotFoundError as err:
            problems.append(Problem(field, str(err)))
    return problems


def _env_problems(config: Config, command: Command) -> list[Problem]:
    """Makes the environment once; checks it can play here, its held-out split and its
    demonstrations."""
    run = config.run
    try:
        env = make_env(run.env, **run.env_kwargs)
    except (UnknownEnvError, ImportError) as err:
        return [Problem("run.envs" if run.envs else "run.env", str(err))]
    except (TypeError, ValueError) as err:  # e.g. a tool that cannot be imported
        field = "run.envs" if run.envs else "run.env_kwargs" if run.env_kwargs else "run.env"
        given = run.envs or run.env_kwargs
        return [Problem(field, f"cannot make {run.env!r} with {given}: {err}")]
    try:
        agent = cast(AgentEnv, env.unwrapped)  # make_env made an agent environment
        members = "run.envs" if run.envs else "run.env_kwargs.envs"
        problems = [
            *_readiness_problems(env, "run.env_kwargs", members),
            *_split_problems(config, command, agent),
            *_demonstration_problems(config, command, agent),
        ]
        problems += [] if problems else _checker_problems(env, command)
        levels = run.curriculum.levels
        found = level_problem(levels, agent, run.env) if command == "train" else None
        return problems + ([Problem("run.curriculum.levels", found)] if found else [])
    finally:
        env.close()


def _benchmark_problems(config: Config, command: Command) -> list[Problem]:
    """`eval.benchmarks` parse and their data packages are installed; `eval.select_by` names
    a held-out figure the run logs (one where higher is better)."""
    from agentgym.eval.benchmarks import parse_benchmark, selectable

    ev, problems = config.eval, []
    choices = []
    for spec in ev.benchmarks:
        try:
            choices.append(parse_benchmark(spec))
        except ValueError as err:
            problems.append(Problem("eval.benchmarks", str(err)))
    for module in dict.fromkeys(c.benchmark.module for c in choices):
        if not available(module):
            problems.append(Problem("eval.benchmarks", f"needs {module}: {install_hint(module)}"))
    if ev.select_by is not None and command == "train":
        valid = selectable(choices, sampled=ev.n > 0)
        if ev.select_by not in valid:
            why = f"{ev.select_by!r} is not a held-out figure this run logs; valid: "
            problems.append(Problem("eval.select_by", why + ", ".join(valid)))
        elif not ev.every:
            problems.append(Problem("eval.select_by", "needs eval.every > 0 (no evaluation)"))
    return problems


def _readiness_problems(env: gym.Env, field: str, members: str) -> list[Problem]:
    """Whether `env` can play here: its MCP servers start, it resets, its sandbox runs.

    Args:
        env: The environment, made and not yet reset.
        field: Where its keyword arguments are set, e.g. "run.env_kwargs".
        members: Where a mix's members are set, e.g. "run.envs" ("[i]" follows).
    """
    agent = env.unwrapped
    if isinstance(agent, EnvMix):  # each member on its own: a reset plays only one
        problems = []
        for i, member in enumerate(agent.members):
            where = f"{members}[{i}].env_kwargs"
            problems += _readiness_problems(member.env, where, f"{where}.envs")
        return problems
    problems = _mcp_problems(agent, field)
    if problems:
        return problems  # the reset would start the same servers, and fail the same way
    try:
        env.reset(seed=0)
        # Code-v0 makes its sandbox on first use, here; a `python` tool's was made by reset
        sandbox = getattr(agent, "sandbox", None)
        if isinstance(sandbox, Sandbox):
            return _sandbox_problems(sandbox, agent, field)
    except SandboxUnavailableError as err:
        return [Problem(f"{field}.sandbox", _sandbox_fix(agent, str(err)))]
    except McpStartError as err:  # a server another way than `mcp_servers`
        return [Problem(field, str(err))]
    except Exception as err:  # not the config's: said, and left to the run
        # A reset that fails for a task (a store down for a moment) is the run's failure
        # policy's to count, episode by episode (run.max_failed_fraction), not a refusal.
        logger.warning(
            "preflight: a reset of the environment set by %s raised %s: %s; the run goes on, "
            "counting episodes whose reset fails as unscorable",
            field,
            type(err).__name__,
            err,
        )
    return []


def _mcp_problems(agent: gym.Env, field: str) -> list[Problem]:
    """Starts each of the environment's MCP servers and lists its tools."""
    problems = []
    for i, server in enumerate(getattr(agent, "mcp_servers", None) or ()):
        if not isinstance(server, McpServer):
            continue
        try:
            server.tools()
        except (McpStartError, ImportError, ValueError) as err:
            fix = (
                "valid: a command that starts an MCP server on stdio (run it by hand to see "
                "why it stops), or the URL of a running streamable HTTP server"
            )
            problems.append(Problem(f"{field}.mcp_servers[{i}]", f"{err}; {fix}"))
    return problems


def _sandbox_problems(sandbox: Sandbox, agent: gym.Env, field: str) -> list[Problem]:
    """Runs `PROBE_PROGRAM` in the sandbox; a problem unless it printed "ok"."""
    memory_mb = getattr(agent, "memory_mb", 512)
    try:
        result = sandbox.run(PROBE_PROGRAM, timeout_s=PROBE_TIMEOUT_S, memory_mb=memory_mb)
    except SandboxUnavailableError as err:  # an engine that fails only when a run starts
        return [Problem(f"{field}.sandbox", _sandbox_fix(agent, str(err)))]
    if result.ok and result.stdout.strip() == "ok":
        return []
    said = (result.stderr.strip() or result.stdout.strip())[-500:]
    why = f"the sandbox could not run `{PROBE_PROGRAM}`: status {result.status!r}"
    return [Problem(f"{field}.sandbox", _sandbox_fix(agent, f"{why} ({said})" if said else why))]


def _sandbox_fix(agent: gym.Env, why: str) -> str:
    """`why`, then which sandbox it was and the other kind to pick."""
    kind = getattr(agent, "sandbox_kind", None)
    other = {"local": "docker", "docker": "local"}.get(str(kind))
    prefix = f"the {kind!r} sandbox: " if kind else ""
    return prefix + why.rstrip(".") + (f"; or sandbox: {other!r}" if other else "")


def _split_problems(config: Config, command: Command, agent: AgentEnv) -> list[Problem]:
    """Whether the held-out split holds the tasks asked of it.

    The selection tasks are the split's first `eval.tasks`, the report's the
    `eval.report_tasks` after them (see `train.train`).
    """
    ev = config.eval
    selection = command == "eval" or (command == "train" and ev.every > 0)
    report = command == "train" and ev.report_tasks > 0
    if not (selection or report):
        return []
    try:
        total = agent.num_tasks(ev.split)
    except NotImplementedError as err:
        return [Problem("run.env", f"cannot evaluate on it: {err}")]
    where = f"the {ev.split!r} split (eval.split) of {config.run.env!r} holds {total}"
    problems = []
    if selection and ev.tasks > total:
        why = f"{ev.tasks} tasks asked, but {where}"
        problems.append(Problem("eval.tasks", f"{why}; valid: 1 to {total}"))
    if report and ev.tasks + ev.report_tasks > total:
        why = (
            f"the report's {ev.report_tasks} tasks follow the {ev.tasks} of eval.tasks, "
            f"{ev.tasks + ev.report_tasks} in all, but {where}"
        )
        valid = f"eval.tasks + eval.report_tasks <= {total}"
        problems.append(Problem("eval.report_tasks", f"{why}; valid: {valid}"))
    return problems


def _checker_problems(env: gym.Env, command: Command) -> list[Problem]:
    """`train` runs the checker's cheap checks: disjoint splits (ids and prompts), and
    expected calls of tools each task offers (`agentgym.env.checker.cheap_checks`)."""
    if command != "train":
        return []
    try:
        cheap_checks(env)
    except AgentEnvCheckError as err:
        return [Problem("run.env", f"{err} (check_agent_env's cheap checks)")]
    except Exception:  # noqa: BLE001: a task that fails to load fails its episode, by the
        return []  # run's failure policy (run.max_failed_fraction), as a reset that raises
    return []


def _demonstration_problems(config: Config, command: Command, agent: AgentEnv) -> list[Problem]:
    """Whether the environment has the demonstrations SFT trains on, when SFT runs."""
    if command == "sft":
        field, valid = "run.env", "an environment with demonstrations"
    elif command == "train" and config.sft.warmup:
        field, valid = "sft.warmup", "false for this environment"
    else:
        return []
    task = agent.load_task(agent.task_id("train", 0))
    try:
        agent.demonstration(task)
    except NotImplementedError as err:
        return [Problem(field, f"SFT trains on demonstrations, and {err}; valid: {valid}")]
    return []


# -- what the backends need of this machine and this launch ----------------------------


def check_registered(config: Config) -> None:
    """ConfigError unless `grpo.loss` and `grpo.advantage` name registered entries."""
    if problems := unregistered(config.grpo):
        raise ConfigError("\n".join(f"{key}: {why}" for key, why in problems.items()))


def require_ray() -> Any:
    """Imports Ray, or raises ConfigError naming the setting and the install command."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "distributed.backend: 'ray' needs Ray, which is not installed: "
            "pip install 'ray>=2.9' (or pip install 'agentgym[distributed]')"
        ) from None
    return ray


def require_backends(config: Config) -> None:
    """Fails before any model loads when a backend the config names is not here: Ray for
    `distributed.backend: ray`, vLLM for `policy.backend: vllm` (`require_vllm`)."""
    if config.distributed.backend == "ray":
        require_ray()
    if config.policy.backend == "vllm":
        require_vllm(config)


def require_vllm(config: Config) -> None:
    """Fails before any model loads when `policy.backend: vllm` cannot run here: vLLM is
    not installed, or `policy.enable_sleep_mode` is set where vLLM has no sleep mode."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        raise ConfigError(
            "policy.backend 'vllm' needs vLLM: pip install -e '.[vllm]' with a GPU, or "
            f"`make setup-vllm` for its CPU build in .venv-vllm ({err})"
        ) from None
    from agentgym.policy.vllm import check_sleep_mode

    check_sleep_mode(config.policy.enable_sleep_mode)


def check_torchrun(config: Config) -> None:
    """Raises ConfigError for the first rule that holds under torchrun (more than one rank)
    that `config` breaks (`agentgym.config.rules`)."""
    if ranks.world_size() <= 1:
        return
    broken = broken_rules(config, torchrun=True)
    if broken:
        raise ConfigError(broken[0])
