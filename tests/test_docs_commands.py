"""Every `agentgym ...` command in the shell blocks of README.md and docs/*.md runs as written,
adapted to the tiny model by the rule docs/testing.md states ("Commands in the docs").

A command is a line of a ```bash, sh, shell, console or plain ``` block (backslash
continuations joined, a leading `$ ` and a trailing `# comment` dropped) whose first word,
after `VAR=value` assignments, is `agentgym` and whose second is not shown output
(`agentgym train: error: ...`). Train, sft, rft and eval run until a model would load: their
flags, config, environment and preflight all passed. `envs` and `doctor` run fully. The rest
is parsed only: `view`, `export`, `serve`, `serve-env` and `train --resume DIR` need a run
folder or start a server, and `PARSE_ONLY` names each command that needs what this machine
lacks, with the reason. `NEEDS` names the optional packages a command needs (parsed only,
and skipped, where one is missing); `REFUSED` the commands the docs show refused.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentgym.policy.models
from agentgym.cli import build_parser, main
from agentgym.cli_flags import parse
from agentgym.extras import EXTRAS, available
from agentgym.policy.models import built_in_models

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([^\s`{]*)")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
UP_TO_THE_MODEL = {"train", "sft", "rft", "eval"}
RUN_FULLY = {"envs", "doctor"}
NEED_A_RUN_OR_SERVE = {"view", "export", "serve", "serve-env"}

PARSE_ONLY = {
    (
        "runs.md: agentgym train --env openenv --set run.env_kwargs.url=http://127.0.0.1:8000"
    ): "an OpenEnv server already running at run.env_kwargs.url",
    (
        "ecosystem.md: agentgym train --env openenv --set "
        "run.env_kwargs.url=http://127.0.0.1:8000 --model tiny-random --steps 2"
    ): "an OpenEnv server already running at run.env_kwargs.url",
    (
        "ecosystem.md: agentgym eval --env openenv --set "
        "run.env_kwargs.url=http://127.0.0.1:8000 --model runs/<run>/checkpoint-best "
        "--tasks 8"
    ): "an OpenEnv server already running at run.env_kwargs.url",
    (
        "ecosystem.md: agentgym train --env openenv --set run.env_kwargs.image=my-env:latest"
    ): "the Docker image my-env:latest on this machine (and a Docker engine)",
    (
        "ecosystem.md: agentgym train --env harbor:tests/harbor_tasks --model "
        "tiny-random --steps 2 --set grpo.tasks_per_step=1 --set grpo.group_size=2"
    ): "a Docker engine: each Harbor task's image is built when the env is made",
    (
        "ecosystem.md: agentgym eval --env harbor:tests/harbor_tasks --model "
        "runs/<run>/checkpoint-best --tasks 1"
    ): "a Docker engine: each Harbor task's image is built when the env is made",
    (
        "ecosystem.md: agentgym train --env harbor:my_tasks --set "
        "run.env_kwargs.test_tasks=[task-a,task-b]"
    ): "a Docker engine, and the reader's own Harbor folder my_tasks",
    "scaling.md: agentgym train --env tool_call --policy vllm": (
        "vLLM (a GPU build, or .venv-vllm's CPU build), not in the test's venv"
    ),
    (
        "scaling.md: agentgym train --env tool_call --distributed ray "
        "--rollout-workers 8 --ray-address auto"
    ): "a running Ray cluster (--ray-address auto)",
    (
        "scaling.md: agentgym train --env tool_call --config configs/tool_call.yaml "
        "--policy vllm --distributed ray --rollout-workers 15 --ray-address auto "
        "--set distributed.weight_sync=collective --set "
        "policy.gpu_memory_utilization=0.8"
    ): "vLLM and a running Ray cluster (--policy vllm --ray-address auto)",
}
"""Commands that need what the test machine lacks: parsed only. Keyed by file and text."""

SERVE = ("fastapi", "uvicorn", "openai")  # --agent: the endpoint the agent calls
OPENENV = ("websockets", "openenv")  # a server started from an OpenEnv folder
NEEDS = {
    (
        "README.md: agentgym train --env tool_call --model tiny-random --agent "
        "docs/tool_agent.py:agent --steps 2"
    ): SERVE,
    (
        "README.md: agentgym train --env tool_call --set "
        "run.env_kwargs.tool_format=native --set model.chat_template=qwen2.5 --set "
        "run.env_kwargs.mcp_servers=[{command: [python, my_server.py]}]"
    ): ("mcp",),
    (
        "agents.md: agentgym train --env tool_call --model tiny-random --agent "
        "docs/tool_agent.py:agent --steps 2 --output runs/agent"
    ): SERVE,
    (
        "agents.md: agentgym train --env tool_call --agent docs/tool_agent.py:agent "
        "--steps 1 --output runs/agent-embedded"
    ): SERVE,
    (
        "agents.md: agentgym eval --env tool_call --model "
        "runs/agent/checkpoint-000002 --agent docs/tool_agent.py:agent --tasks 8"
    ): SERVE,
    ("benchmarks.md: agentgym eval --benchmark bfcl:multi_turn_base@20 --model embedded"): (
        "bfcl_eval",
    ),
    (
        "benchmarks.md: agentgym eval --benchmark tooltalk@20 --benchmark "
        "tau2:retail@10 --model runs/x/checkpoint-best"
    ): ("tooltalk", "tau2"),
    (
        "benchmarks.md: agentgym train --config configs/tool_call.yaml --set "
        'eval.every=5 --set eval.benchmarks=["bfcl:simple_python,multiple@50"] --set '
        "eval.select_by=bench/bfcl/correctness"
    ): ("bfcl_eval",),
    (
        "benchmarks.md: agentgym eval --env agentgym/BFCLMultiTurn-v0 --model MODEL "
        "--tasks 20 --set run.env_kwargs.benchmark=true --set "
        "run.env_kwargs.categories=[multi_turn_base]"
    ): ("bfcl_eval",),
    (
        "benchmarks.md: agentgym eval --env agentgym/Tau2-v0 --model embedded --tasks "
        '20 --set run.env_kwargs={"benchmark": true}'
    ): ("tau2",),
    (
        "benchmarks.md: agentgym train --env agentgym/Tau2-v0 --set "
        'run.env_kwargs={"categories": ["retail"]}'
    ): ("tau2",),
    (
        "difficulty.md: agentgym train --env math --set run.env_kwargs.difficulty=2 "
        "--set run.env_kwargs.generators=[gsm_symbolic, word_sorting]"
    ): ("reasoning_gym",),
    (
        "ecosystem.md: agentgym train --env openenv --set "
        "run.env_kwargs.folder=tests/openenv_envs/add_two --set "
        "run.env_kwargs.sessions_per_server=64 --model tiny-random --steps 2"
    ): OPENENV,
    (
        "ecosystem.md: agentgym train --env verifiers:vf_sums --model tiny-random "
        "--steps 2 --output runs/vf --set run.env_kwargs.num_tasks=12"
    ): ("verifiers",),
    (
        "ecosystem.md: agentgym eval --env verifiers:vf_sums --model "
        "runs/vf/checkpoint-000002 --tasks 2"
    ): ("verifiers",),
    (
        "results.md: agentgym train --config configs/openenv_add_two.yaml --output runs/add_two"
    ): OPENENV,
    "results.md: agentgym eval --benchmark tooltalk@20 --output runs/eval-tooltalk": ("tooltalk",),
    "results.md: agentgym eval --benchmark tau2@5 --output runs/eval-tau2": ("tau2",),
    ("results.md: agentgym eval --benchmark bfcl:multi_turn_base@20 --output runs/eval-bfcl-mt"): (
        "bfcl_eval",
    ),
    (
        "runs.md: agentgym train --env math --model ./my-sft-model --config "
        "configs/math.yaml --set grpo.beta=0.02"
    ): ("reasoning_gym",),
    "runs.md: agentgym train --env tool_call --agent my_agents.py:agent": SERVE,
    "scaling.md: agentgym train --env tool_call --distributed ray --rollout-workers 2": ("ray",),
    (
        "tasks.md: agentgym eval --env agentgym/Tasks-v0 --split test --set "
        "run.env_kwargs.data=bfcl.jsonl --set run.env_kwargs.tools_column=tools --set "
        "run.env_kwargs.expected_calls_column=calls --set "
        "run.env_kwargs.category_column=category --set "
        "run.env_kwargs.string_match=bfcl"
    ): ("bfcl_eval",),
    (
        "tasks.md: agentgym eval --env agentgym/BFCL-v0 --set "
        "run.env_kwargs.benchmark=true --split test"
    ): ("bfcl_eval",),
}
"""The optional packages each command needs beyond `pip install agentgym`. Where one is
missing (`make test-lowest`'s venv has no mcp, openenv, verifiers or benchmark data), the
command is parsed only and the test skips, naming it."""

REFUSED = {
    "tasks.md: agentgym train --env tasks --set run.env_kwargs.data=bad.jsonl": (
        "bad.jsonl's rows have problems; the doc shows the error printed"
    ),
}
"""Commands the docs show refused: exit 2, printing the lines shown after them."""


@dataclass(frozen=True)
class DocCommand:
    """One `agentgym ...` line of a doc's shell block."""

    file: str  # "README.md", or a file of docs/ by its name
    line: int  # 1-based, the command's first line
    argv: tuple[str, ...]  # after `agentgym`
    env: tuple[tuple[str, str], ...]  # the block's earlier `export`s, then its `VAR=value`s
    shown: tuple[str, ...] = ()  # in a console block, the output lines shown after it

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def key(self) -> str:
        """How the dicts above name it: its file and its text, which edits elsewhere in the
        file leave as they are (its line number does not)."""
        return f"{self.file}: agentgym {' '.join(self.argv)}"


def shell_lines(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line number, logical line, whether it opens a block) of the shell blocks of `path`:
    continuations joined, heredoc bodies left out."""
    lines = path.read_text().splitlines()
    fence = ""  # the open block's fence; "" outside blocks
    counts = opened = False
    heredoc = ""
    i = 0
    while i < len(lines):
        number, text = i + 1, lines[i]
        i += 1
        stripped = text.strip()
        if not fence:
            if m := FENCE.match(stripped):
                fence, counts, opened = m.group(1), m.group(2).lower() in SHELL_LANGUAGES, True
            continue
        if stripped.startswith(fence) and not stripped.strip(fence[0]):
            fence = ""
            continue
        if not counts:
            continue
        if heredoc:
            heredoc = "" if stripped == heredoc else heredoc
            continue
        while text.endswith("\\") and i < len(lines):
            text = text[:-1] + " " + lines[i].strip()
            i += 1
        if m := HEREDOC.search(text):
            heredoc = m.group(2)
        yield number, text.strip(), opened
        opened = False


def doc_commands(path: Path) -> list[DocCommand]:
    """The `agentgym ...` commands of `path`'s shell blocks, in order."""
    name = path.name  # README.md, or a file of docs/
    found: list[tuple[DocCommand, list[str]]] = []
    exports: dict[str, str] = {}
    output: list[str] | None = None  # a `$ ` command's output lines, while they go on
    for number, text, opened in shell_lines(path):
        if opened:
            exports, output = {}, None
        if output is not None and not text.startswith("$ "):
            output.append(text)
            continue
        words = shlex.split(text.removeprefix("$ "), comments=True)  # quoted # stays
        env: dict[str, str] = {}
        while words and ASSIGNMENT.match(words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if words[:1] == ["export"]:
            exports.update(w.split("=", 1) for w in words[1:] if ASSIGNMENT.match(w))
        output = [] if text.startswith("$ ") else None
        if len(words) < 2 or words[0] != "agentgym" or words[1].endswith(":"):
            continue  # not an agentgym command, or its output (`agentgym train: error: ...`)
        command = DocCommand(name, number, tuple(words[1:]), tuple({**exports, **env}.items()))
        found.append((command, output if output is not None else []))
    return [DocCommand(c.file, c.line, c.argv, c.env, tuple(shown)) for c, shown in found]


COMMANDS = [c for path in DOCS for c in doc_commands(path)]


# ---- the adaptation rule -------------------------------------------------------------------


def adapted(argv: tuple[str, ...], output: Path) -> list[str]:
    """`--model X` and `--baseline X` made `tiny-random` (a built-in tiny-random variant
    stays), `--output X` made `output`."""
    out: list[str] = []
    words = iter(argv)
    for word in words:
        flag, eq, value = word.partition("=")
        if flag in ("--model", "--baseline", "--output"):
            value = value if eq else next(words)
            if flag == "--output":
                value = str(output)
            elif not (value.startswith("tiny-random") and value in built_in_models()):
                value = "tiny-random"
            out += [flag, value]
        else:
            out.append(word)
    return out


def _resume(argv: tuple[str, ...]) -> str | None:
    """The value of `--resume`, if given."""
    for i, word in enumerate(argv):
        flag, eq, value = word.partition("=")
        if flag == "--resume":
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    return None


def how_checked(command: DocCommand) -> str:
    """How the test checks the command: "load" (it runs until a model would load), "run" (to
    the end), "parse" (the parser accepts it) or "refused" (exit 2, as the doc shows)."""
    if command.key in REFUSED:
        return "refused"
    sub = command.argv[0]
    if command.key in PARSE_ONLY or sub in NEED_A_RUN_OR_SERVE:
        return "parse"
    if _resume(command.argv) not in (None, "auto"):
        return "parse"  # --resume DIR: a checkpoint of an earlier run (auto: a fresh start)
    if sub in RUN_FULLY:
        return "run"
    assert sub in UP_TO_THE_MODEL, f"{command.id}: no rule for `agentgym {sub}`"
    return "load"


# ---- the files the docs tell the reader to write -------------------------------------------

MY_SERVER = '''"""An MCP server over stdio with one tool."""
from mcp.server.mcpserver import MCPServer

server = MCPServer("my-server", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


if __name__ == "__main__":
    server.run("stdio")
'''

BAD_ROWS = [  # the problems docs/tasks.md shows, on lines 3, 4 and 6
    '{"prompt": "What is 1 + 1?", "answer": 2}',
    '{"prompt": "What is 2 + 3?", "answer": 5}',
    '{"prompt": "What is 2 + 2?" "answer": 4}',
    '{"prompt": "What is 3 + 3?"}',
    '{"prompt": "What is 4 + 4?", "answer": 8}',
    '{"prompt": "", "answer": 1}',
]


def _heredoc(path: Path, name: str) -> str:
    """The body of the doc's `cat > name <<'EOF'` block."""
    text = path.read_text()
    m = re.search(rf"cat > {re.escape(name)} <<'(\w+)'\n(.*?)\n\1\n", text, re.S)
    assert m, f"{path.name}: no heredoc writing {name}"
    return m.group(2) + "\n"


def _python_block(path: Path, first_line: str) -> str:
    """The body of the doc's ```python block whose first line is `first_line`."""
    text = path.read_text()
    m = re.search(rf"```python\n({re.escape(first_line)}\n.*?)```", text, re.S)
    assert m, f"{path.name}: no python block beginning {first_line!r}"
    return m.group(1)


def _bfcl_rows(path: Path) -> None:
    from agentgym.envs.tasks import bfcl_rows

    assert bfcl_rows.main([str(path), "--categories", "simple_python"]) == 0


def working_dir(folder: Path, argv: list[str]) -> Path:
    """A folder holding what the docs' commands read: configs/, tests/ and docs/ (links to the
    repository's), and the files the docs tell the reader to write."""
    folder.mkdir()
    for name in ("configs", "tests", "docs"):
        (folder / name).symlink_to(ROOT / name, target_is_directory=True)
    (folder / "my.jsonl").write_text(_heredoc(ROOT / "docs/tasks.md", "my.jsonl"))
    (folder / "bad.jsonl").write_text("\n".join(BAD_ROWS) + "\n")
    shutil.copy(ROOT / "docs/tool_agent.py", folder / "my_agents.py")
    (folder / "my_server.py").write_text(MY_SERVER)
    (folder / "acme").mkdir()
    (folder / "acme/__init__.py").write_text("")
    for module in ("weather", "phone"):
        body = _python_block(ROOT / "README.md", f"# acme/{module}.py")
        (folder / f"acme/{module}.py").write_text(body)
    if any("bfcl.jsonl" in w for w in argv) and available("bfcl_eval"):  # as tasks.md makes it
        _bfcl_rows(folder / "bfcl.jsonl")
    return folder


class _ModelLoads(Exception):
    """A model was about to load: everything before it passed."""


def _set_env(command: DocCommand, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's `VAR=value`s; PYTHONPATH's folders (from `cwd`) also on sys.path, and
    `python` the test's interpreter."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for name, value in command.env:
        if name == "PYTHONPATH":
            folders = [str(cwd / p) for p in value.split(os.pathsep) if p]
            for folder in reversed(folders):
                monkeypatch.syspath_prepend(folder)
            value = os.pathsep.join(folders)
        monkeypatch.setenv(name, value)


def _printed(line: str, output: str) -> bool:
    """Whether `output` holds `line`, whatever the spaces and line breaks (rich wraps)."""
    return " ".join(line.split()) in " ".join(output.split())


@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_the_docs_command_runs_as_written(command, tmp_path, monkeypatch, capsys):
    argv = adapted(command.argv, tmp_path / "output")
    how = how_checked(command)
    cwd = working_dir(tmp_path / "work", argv)
    monkeypatch.chdir(cwd)
    _set_env(command, cwd, monkeypatch)
    missing = [m for m in NEEDS.get(command.key, ()) if not available(m)]
    if how == "parse" or missing:
        try:
            parse(build_parser(), argv)
        except SystemExit as exit:
            err = capsys.readouterr().err
            pytest.fail(f"agentgym {shlex.join(argv)}: not parsed (exit {exit.code}):\n{err}")
        if missing:
            pytest.skip(f"parsed only: {', '.join(missing)} not installed")
        return
    if how != "run":  # envs and doctor run fully; doctor loads its tiny model

        def load(name, *args, **kwargs):
            raise _ModelLoads(name)

        monkeypatch.setattr(agentgym.policy.models, "load_model_and_tokenizer", load)
    reached, code = False, None
    try:
        code = main(argv)
    except _ModelLoads:
        reached = True
    except SystemExit as exit:  # refused by the parser
        code = exit.code
    out, err = capsys.readouterr()
    said = f"agentgym {shlex.join(argv)}: exit {code}\nstdout:\n{out}\nstderr:\n{err}"
    if how == "refused":
        assert code == 2 and command.shown, said
        for line in command.shown:
            assert _printed(line.replace("/home/me/", f"{cwd}/"), err), f"{line!r}?\n{said}"
    elif how == "run":
        assert code == 0, said
        for line in command.shown:  # what the doc shows it print, `...` for the lines left out
            assert line == "..." or _printed(line, out), f"{line!r} not printed\n{said}"
    else:
        assert reached, f"no model was loaded\n{said}"


def test_commands_are_found_in_every_kind_of_shell_block():
    assert len(COMMANDS) > 50
    files = {c.file for c in COMMANDS}
    assert {"README.md", "runs.md", "tasks.md", "ecosystem.md"} <= files
    placeholders = [c.id for c in COMMANDS if any(w == "..." or w[:1] == "<" for w in c.argv)]
    assert not placeholders, f"not runnable as written: {placeholders}"


def test_each_exception_names_a_command_the_docs_hold():
    ids = {c.key for c in COMMANDS}
    assert set(PARSE_ONLY) <= ids, sorted(set(PARSE_ONLY) - ids)
    assert set(REFUSED) <= ids, sorted(set(REFUSED) - ids)
    assert set(NEEDS) <= ids, sorted(set(NEEDS) - ids)
    assert {m for modules in NEEDS.values() for m in modules} <= {*EXTRAS, "mcp", "ray"}
    for key in PARSE_ONLY:
        (command,) = (c for c in COMMANDS if c.key == key)
        assert command.argv[0] in UP_TO_THE_MODEL, f"{key}: parsed only by the rule already"


def test_the_extraction_reads_fences_continuations_comments_and_output(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```python\nagentgym train --env nope\n```\n"
        "```bash\nexport PYTHONPATH=tests\n"
        "PYTHONPATH=. agentgym train --env math \\\n  --set 'a=#b'   # a comment's `quote'\n"
        "cat > x <<'EOF'\nagentgym envs\nEOF\nagentgym eval --env math\n```\n"
        "```console\n$ agentgym train --env tasks\nagentgym train: error: invalid config:\n"
        "  run.env: bad\n$ agentgym envs\n```\n"
        "   ```\n   agentgym envs\n   ```\n"
        "```text\nagentgym view built the page\n```\n"
        "```sh\nagentgym view: wrote it\n```\n"
    )
    found = doc_commands(doc)
    assert [(c.line, c.argv, c.env, c.shown) for c in found] == [
        (6, ("train", "--env", "math", "--set", "a=#b"), (("PYTHONPATH", "."),), ()),
        (11, ("eval", "--env", "math"), (("PYTHONPATH", "tests"),), ()),
        (14, ("train", "--env", "tasks"), (),
         ("agentgym train: error: invalid config:", "run.env: bad")),
        (17, ("envs",), (), ()),
        (20, ("envs",), (), ()),
    ]  # fmt: skip


def test_the_rule_makes_models_tiny_and_outputs_fresh(tmp_path):
    argv = ("eval", "--model", "runs/<run>/checkpoint-best", "--baseline=embedded", "--output",
            "runs/x", "--tasks", "8")  # fmt: skip
    assert adapted(argv, tmp_path) == [
        "eval", "--model", "tiny-random", "--baseline", "tiny-random", "--output",
        str(tmp_path), "--tasks", "8",
    ]  # fmt: skip
    assert adapted(("doctor", "--model", "tiny-random-llama3"), tmp_path)[-1] == (
        "tiny-random-llama3"
    )


def test_resume_dir_is_parsed_only_and_resume_auto_runs():
    def command(*argv: str) -> DocCommand:
        return DocCommand("x.md", 1, ("train", *argv), ())

    assert how_checked(command("--resume", "runs/a")) == "parse"
    assert how_checked(command("--resume=runs/a/checkpoint-000006")) == "parse"
    assert how_checked(command("--resume", "auto", "--output", "runs/a")) == "load"


# ---- the README's own environment: a verifier that random text cannot game --------------


@pytest.fixture(scope="module")
def weather(tmp_path_factory):
    """README's `acme/weather.py`, as a module of its own, its env made by gymnasium."""
    import importlib.util

    import gymnasium as gym

    path = tmp_path_factory.mktemp("readme") / "readme_weather.py"
    body = _python_block(ROOT / "README.md", "# acme/weather.py")
    path.write_text(re.sub(r"\ngym\.register\(.*\)\n", "\n", body))  # registered below
    spec = importlib.util.spec_from_file_location("readme_weather", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if "readme/Weather-v0" not in gym.registry:
        gym.register(id="readme/Weather-v0", entry_point=module.WeatherEnv)
    env = gym.make("readme/Weather-v0")
    yield env
    env.close()


def _reward(env, task_id: str, text: str) -> float:
    env.reset(options={"task_id": task_id})
    return env.step(text)[1]


TRICKS = ["I do not know", "not", "none", "no way", "yes and no", "know", "nobody", "Yes? No.",
          "The answer is yes", "yesterday", "eyes", ""]  # fmt: skip


@pytest.mark.parametrize("text", TRICKS)
def test_the_readme_weather_verifier_pays_no_trick_text(weather, text):
    for task_id in ("train/bergen", "train/cairo", "test/oslo"):  # answers yes, no, yes
        assert _reward(weather, task_id, text) == 0.0


@given(st.text(max_size=60))
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_the_readme_weather_verifier_pays_random_text_nothing(weather, text):
    for task_id, answer in (("train/cairo", "no"), ("test/oslo", "yes")):
        said = text.strip().rstrip(".").lower()
        assert _reward(weather, task_id, text) == float(said == answer)


def test_the_readme_weather_verifier_pays_the_answer_alone(weather):
    assert _reward(weather, "train/cairo", "No.") == _reward(weather, "test/oslo", " yes ") == 1.0
