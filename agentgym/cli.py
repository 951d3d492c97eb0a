"""The `agentgym` command: train, sft, rft, eval, serve, serve-env, envs, doctor."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from agentgym.cli_flags import add_config_arguments, default_run, names_env, parse
from agentgym.config import Config, ConfigError, EvalConfig
from agentgym.config_cli import load, version
from agentgym.extras import MissingExtraError, require_serve
from agentgym.serve.agent_thread import stray_threads
from agentgym.serve_cli import serve_parser
from agentgym.serve_env_cli import cmd_serve_env, serve_env_parser
from agentgym.view.view_command import cmd_view, view_parser

BENCH_HELP = "a public benchmark instead of --env: bfcl, tooltalk, tau2 (eval.benchmarks)"
AGENT_FLAG_HELP = (
    "an agent program that plays the episodes through the OpenAI-compatible endpoint: "
    "module:function or file.py:function (run.agent; docs/agents.md)"
)


def _run_parser(
    sub, name: str, help_text: str, steps_field: str, steps_flag: str = "--steps"
) -> None:
    p = sub.add_parser(name, help=help_text)
    p.add_argument("--env", help="math, a registered id, or module:Env-v0 (run.env)")
    p.add_argument("--model", help="path, hub id, 'tiny-random' or 'embedded' (model.name)")
    p.add_argument("--config", type=Path, help="YAML config; flags and --set override it")
    what = steps_flag.removeprefix("--")
    p.add_argument(
        steps_flag, dest="steps", type=int, metavar=what.upper(), help=f"{what} ({steps_field})"
    )
    p.set_defaults(steps_field=steps_field)
    p.add_argument("--output", type=Path, help="run directory (run.output)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override any config field, e.g. --set grpo.beta=0.02 (repeatable)",
    )


def _train_parser(sub: Any) -> None:
    """`agentgym train`: the run's flags, resuming, and where rollouts run."""
    _run_parser(sub, "train", "GRPO-train a policy on an environment.", "run.steps")
    train = sub.choices["train"]
    train.add_argument(
        "--resume",
        metavar="DIR|auto",
        help="go on from a checkpoint folder, or a run folder's newest complete checkpoint; "
        "'auto': run.output's newest, or a fresh start when it has none",
    )
    train.add_argument(
        "--policy",
        choices=["hf", "vllm"],
        help="what samples the rollouts: transformers or a vLLM engine (policy.backend)",
    )
    train.add_argument("--agent", metavar="MODULE:FUNCTION", help=AGENT_FLAG_HELP)
    train.add_argument(
        "--distributed",
        choices=["none", "ray"],
        help="where rollouts run: here, or on Ray actors (distributed.backend)",
    )
    train.add_argument(
        "--rollout-workers",
        type=int,
        metavar="N",
        help="Ray rollout actors (distributed.rollout_workers)",
    )
    train.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="Ray cluster to join, e.g. auto (distributed.ray_address); default: start a local Ray",
    )


def _export_parser(sub: Any) -> None:
    ex = sub.add_parser("export", help="Write a run's model as a folder other tools load.")
    ex.add_argument("source", type=Path, metavar="RUN_OR_CHECKPOINT")
    ex.add_argument("--output", type=Path, required=True, help="a new or empty folder")
    ex.add_argument("--merge", action="store_true", help="merge LoRA adapters into the base")
    ex.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="default: as trained")
    ex.add_argument("--push-to-hub", metavar="REPO", help="upload the folder to this hub repo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentgym", description="Train tool-calling LLM agents with GRPO."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _train_parser(sub)
    _run_parser(sub, "sft", "Supervised warm-up on the environment's demonstrations.", "sft.steps")
    rft_help = "Rejection-sampling fine-tuning: SFT on the policy's own verified episodes."
    _run_parser(sub, "rft", rft_help, "rft.rounds", "--rounds")
    ev = sub.add_parser("eval", help="Evaluate a model on an environment's held-out tasks.")
    ev.add_argument("--env", help="math, a registered id, or module:Env-v0 (run.env)")
    ev.add_argument("--model", help="path, hub id, 'tiny-random' or 'embedded' (model.name)")
    ev.add_argument("--config", type=Path, help="YAML config (env_kwargs, sampling, eval)")
    ev.add_argument("--split", choices=["train", "test"], help="split of the tasks (eval.split)")
    ev.add_argument("--tasks", type=int, help="how many tasks, from the split's first (eval.tasks)")
    n = EvalConfig.model_fields["n"]  # one option: its description and default are eval.n's
    n_help = f"{n.description} (eval.n; default: {n.default})".replace("%", "%%")
    ev.add_argument("--n", type=int, metavar="N", help=n_help)
    ev.add_argument("--k", type=int, default=None, help="k of pass@k and maj@k (default: n)")
    ev.add_argument("--baseline", help="a second model, played on the same tasks and compared")
    keep = "which played episodes to write beside the report (eval.save_episodes; default all)"
    ev.add_argument("--save-episodes", choices=["none", "failures", "all"], help=keep)
    ev.add_argument("--agent", metavar="MODULE:FUNCTION", help=AGENT_FLAG_HELP)
    ev.add_argument("--benchmark", action="append", metavar="NAME[:CATS][@N]", help=BENCH_HELP)
    ev.add_argument("--output", type=Path, help="report folder (default runs/eval-<env>-<time>)")
    ev.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override any config field",
    )
    for add_parser in (serve_parser, serve_env_parser, view_parser, _export_parser):
        add_parser(sub)
    sub.add_parser("envs", help="List the registered agent environments.")
    doctor = sub.add_parser("doctor", help="Check a model's chat template for tool use.")
    doctor.add_argument("--model", help="path, hub id, 'tiny-random' or 'embedded' (default)")
    doctor.add_argument(
        "--format",
        "--tool-format",
        dest="format",
        choices=["hermes", "react", "native", "all"],
        default="all",
        help="tool-call format; all: hermes, react and, where the template renders tools, native",
    )
    doctor.add_argument(
        "--tool-parser", help="native parser (hermes, llama3_json, mistral); default: detected"
    )
    doctor.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="config overrides; model.chat_template and run.env_kwargs.tool_parser are read",
    )
    for name in ("train", "sft", "rft", "eval"):
        add_config_arguments(sub.choices[name], command=name)  # last: --section.field VALUE
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    """The run's config: YAML file, then --set overrides, then the named flags."""
    flags = {
        "run.env": args.env,
        "model.name": args.model,
        args.steps_field: args.steps,
        "run.output": str(args.output) if args.output else None,
        "policy.backend": getattr(args, "policy", None),  # train's flags only
        "run.agent": getattr(args, "agent", None),
        "distributed.backend": getattr(args, "distributed", None),
        "distributed.rollout_workers": getattr(args, "rollout_workers", None),
        "distributed.ray_address": getattr(args, "ray_address", None),
    }
    named = [f"{k}={v}" for k, v in flags.items() if v is not None]
    config = load(default_run(args), [*args.overrides, *named])
    if config.run.output is None:
        name = config.run.env.replace("/", "_").replace(":", "_")
        config.run.output = Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return config


def cmd_train(args: argparse.Namespace) -> int:
    from agentgym.run.preflight import check
    from agentgym.run.runlog import set_aside
    from agentgym.run.train import train
    from agentgym.scale import ranks

    checkpoint = None
    if args.resume is not None:
        config, checkpoint = _resumed_config(args)
    else:
        config = config_from_args(args)
    check(config, "train")  # every problem, before a model loads
    output = config.run.output
    assert output is not None  # config_from_args names one
    fresh = checkpoint is None and ranks.is_main()  # under torchrun, rank 0 owns run.output
    if fresh and args.resume == "auto":
        # a run stopped before its first checkpoint starts afresh; what it wrote is kept
        if (old := set_aside(output)) is not None:
            print(
                f"--resume auto: no complete checkpoint in {output}; starting afresh, "
                f"the earlier start's logs and checkpoints moved to {old}"
            )
    elif fresh and (output / "metrics.jsonl").exists():
        raise ConfigError(
            f"run.output {str(output)!r} already holds a run (metrics.jsonl); choose a new "
            "--output, or go on from its last checkpoint with --resume auto"
        )
    run_dir = train(config, resume=checkpoint)
    if ranks.is_main():
        print(f"run written to {run_dir}")
    return 0


def _resumed_config(args: argparse.Namespace) -> tuple[Config, Path | None]:
    """The config and checkpoint of `train --resume`: the checkpoint's own config, then
    --set and the flags (--steps to go on further). With `auto` and no checkpoint yet,
    the config from the arguments and None (a fresh start)."""
    from agentgym.run.checkpoint import is_complete, latest_checkpoint

    if args.resume == "auto":
        config = config_from_args(args)
        assert config.run.output is not None  # config_from_args names one
        checkpoint = latest_checkpoint(config.run.output)
        if checkpoint is None:
            return config, None
    else:
        if args.config is not None:
            raise ConfigError(
                "--resume DIR takes the config the checkpoint holds; change a "
                "field with --set section.field=value, not --config"
            )
        path = Path(args.resume)
        checkpoint = path if is_complete(path) else latest_checkpoint(path)
        if checkpoint is None:
            raise ConfigError(
                f"--resume {str(path)!r}: not a complete checkpoint (no COMPLETE file) and no "
                "folder holding one; give a checkpoint-NNNNNN folder or its run folder"
            )
    args.config = checkpoint / "config.yaml"
    args.output = checkpoint.parent
    config = config_from_args(args)
    return config, checkpoint


def cmd_sft(args: argparse.Namespace) -> int:
    from agentgym.run.phases import sft
    from agentgym.run.preflight import check

    config = config_from_args(args)
    check(config, "sft")  # every problem, before a model loads
    assert config.run.output is not None  # config_from_args names one
    if (config.run.output / "metrics.jsonl").exists():
        raise ConfigError(f"run.output {str(config.run.output)!r} already holds a run")
    out = sft(config)
    print(f"checkpoint written to {out / f'checkpoint-{config.sft.steps:06d}'}")
    return 0


def cmd_rft(args: argparse.Namespace) -> int:
    from agentgym.rft.rejection_sampling import check_rft, rft

    config = config_from_args(args)
    check_rft(config)  # every problem, before a model loads
    assert config.run.output is not None  # config_from_args names one
    if (config.run.output / "metrics.jsonl").exists():
        raise ConfigError(f"run.output {str(config.run.output)!r} already holds a run")
    print(f"checkpoint written to {rft(config)}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from agentgym.eval.command import as_trained, run_benchmarks, run_eval, sized_to_split
    from agentgym.run.preflight import check
    from agentgym.scale.players import make_player

    flags = {
        "run.env": args.env,
        "model.name": args.model,
        "eval.split": args.split,
        "eval.tasks": args.tasks,
        "eval.n": args.n,
        "run.agent": args.agent,
        "eval.save_episodes": args.save_episodes,
        "eval.benchmarks": json.dumps(args.benchmark) if args.benchmark else None,
    }
    named = [f"{k}={v}" for k, v in flags.items() if v is not None]
    config = load(args.config, [*args.overrides, *named])
    if not config.eval.benchmarks:  # a checkpoint's own env, and no more tasks than it holds
        named_env = args.env or args.config or names_env(args.overrides, kwargs=True)
        config = sized_to_split(as_trained(config, bool(named_env)))
    n = config.eval.n  # >= 0, as its Field says
    k = args.k if args.k is not None else max(n, 1)
    if (n and not 1 <= k <= n) or (not n and args.k):
        raise ConfigError(f"eval.n {n} --k {args.k}: need 1 <= k <= n (k needs n > 0)")
    benchmarks = config.eval.benchmarks
    name = "benchmarks" if benchmarks else config.run.env.replace("/", "_").replace(":", "_")
    output = args.output or Path("runs") / f"eval-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if (output / "report.json").exists():
        raise ConfigError(f"--output {str(output)!r} already holds a report; choose a new one")
    check(config, "eval", output=output, baseline=args.baseline)  # before a model loads
    if benchmarks:
        run_benchmarks(config, baseline=args.baseline, output=output)
    else:
        run_eval(config, k=k, baseline=args.baseline, output=output, players=make_player)
    print(f"report written to {output}")
    return 0


def cmd_envs(args: argparse.Namespace) -> int:
    import gymnasium as gym

    import agentgym
    from agentgym.env.core import env_doc_line

    short = {v: k for k, v in agentgym.SHORT_NAMES.items()}
    for env_id, spec in sorted(gym.registry.items()):
        if not env_id.startswith("agentgym/"):
            continue
        doc = env_doc_line(spec.entry_point)
        alias = f" ({short[env_id]})" if env_id in short else ""
        print(f"{env_id}{alias}  max_turns={spec.max_episode_steps}  {doc}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from rich.console import Console

    from agentgym.doctor.template_checks import run_doctor
    from agentgym.env.templates import renders_tools
    from agentgym.policy.chat_templates import read_chat_template
    from agentgym.policy.models import load_model_and_tokenizer, resolve_model_name

    config = load(None, args.overrides)
    choice = config.model.chat_template
    try:
        template = read_chat_template(choice) if choice is not None else None
    except ValueError as err:
        raise ConfigError(str(err)) from None
    _, tokenizer = load_model_and_tokenizer(args.model)
    tokenizer.chat_template = template or tokenizer.chat_template
    parser = args.tool_parser or config.run.env_kwargs.get("tool_parser")
    formats = [args.format]
    if args.format == "all":
        formats = ["hermes", "react", *(["native"] if renders_tools(tokenizer) else [])]
    console = Console()
    name = resolve_model_name(args.model)
    results = [run_doctor(tokenizer, name, f, console, parser) for f in formats]
    return 0 if all(results) else 1


def cmd_serve(args: argparse.Namespace) -> int:
    require_serve("agentgym serve")
    from agentgym.serve.endpoint import run_serve
    from agentgym.serve_cli import limits_from

    flags = {"model.name": args.model, "policy.backend": args.policy}
    named = [f"{k}={v}" for k, v in flags.items() if v is not None]
    config = load(args.config, [*args.overrides, *named])
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port}: give a port from 1 to 65535")
    run_serve(config, args.host, args.port, args.api_key, limits_from(args), args.threads)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from agentgym.export.model_folder import export

    try:
        out = export(
            args.source,
            args.output,
            merge=args.merge,
            dtype=args.dtype,
            push_to_hub=args.push_to_hub,
        )
    except (FileNotFoundError, FileExistsError) as err:
        raise ConfigError(str(err)) from None
    print(f"exported to {out}")
    return 0


def run() -> NoReturn:
    """The `agentgym` command and `python -m agentgym`: `main`, then exit with its code.

    The process ends with `os._exit` after the exit handlers and a flush, skipping the
    interpreter's teardown, where that teardown would hang or abort: a torchrun rank whose
    process group outlived `agentgym.learn.dist.shutdown` (FSDP: gloo's threads can abort
    it), and a thread someone else's code left running (an agent program's), which the
    teardown would wait for forever.
    """
    code = main()
    dist = sys.modules.get("agentgym.learn.dist")  # not imported: no group was joined
    outlived = dist is not None and dist.group_outlived_shutdown()
    stray = stray_threads()
    if stray:
        said = f"{len(stray)} threads left running ({', '.join(stray[:5])})"
        print(f"agentgym: {said}; exiting without them", file=sys.stderr)
    if outlived or stray:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `agentgym` command; returns the exit code."""
    from agentgym.env.core import UnknownEnvError
    from agentgym.eval.console import console_logging, quiet_libraries
    from agentgym.policy.models import ModelNotFoundError
    from agentgym.run.interrupt import TrainingError

    args = parse(build_parser(), sys.argv[1:] if argv is None else argv)
    commands = {
        "train": cmd_train,
        "sft": cmd_sft,
        "rft": cmd_rft,
        "eval": cmd_eval,
        "envs": cmd_envs,
        "doctor": cmd_doctor,
        "serve": cmd_serve,
        "serve-env": cmd_serve_env,
        "export": cmd_export,
        "view": cmd_view,
    }
    try:
        console_logging()  # the library's messages, above the progress bars
        quiet_libraries()  # not transformers' bars and FutureWarnings
        return commands[args.command](args)
    except (ConfigError, UnknownEnvError, ModelNotFoundError, MissingExtraError) as err:
        print(f"agentgym {args.command}: error: {err}", file=sys.stderr)
        return 2
    except TrainingError as err:
        print(f"agentgym {args.command}: stopped: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            f"agentgym {args.command}: interrupted; every checkpoint written is complete",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
