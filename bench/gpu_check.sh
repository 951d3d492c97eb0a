#!/usr/bin/env bash
# The GPU checks in one script: under 8 minutes on one GPU, nothing downloaded.
#
#   bash bench/gpu_check.sh             # on a machine with a GPU: the figures for docs/
#   bash bench/gpu_check.sh --dry-run   # here, on the CPU: the same steps, smaller, as a check
#
# It carries nothing big: the models are built in code (`tiny-random`, and `smollm2-shaped`,
# SmolLM2-135M's layers with random weights). Steps, each timed:
#   1. the machine: torch, CUDA, bf16, vLLM;
#   2. tests/test_gpu.py on the device: train, sft and eval placed there with their dtype,
#      a bf16 learner gradient within 5e-2 (relative L2) of fp32, DistributedDataParallel on it (two ranks
#      sharing the one GPU through gloo), packed rows on its attention kernels;
#   3. tests/test_vllm.py (the in-memory weight handover among them) and tests/test_vllm_async.py
#      (async GRPO on the in-process engine), where vLLM imports;
#   4. bench/learner.py: padded vs packed vs TRL's GRPOTrainer, one optimizer step;
#   5. bench/rollout.py: agentgym's batched rollout vs the tutorial's loop (and vLLM).
# Everything goes to $OUT (default gpu_check_out/): one log per step and summary.txt.
# PYTHON names the interpreter (default .venv/bin/python); on a bare machine WHEELS names a
# folder of wheels to install agentgym (and vLLM) from, offline.
set -uo pipefail

DRY=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (valid: --dry-run)" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
# A bare GPU machine: agentgym and its dependencies from a wheel folder ($WHEELS, no network),
# vLLM's GPU build among them where it should be checked too.
if ! "$PY" -c "import agentgym" 2>/dev/null; then
  if [ -n "${WHEELS:-}" ]; then
    python3 -m venv .venv-gpu && PY=.venv-gpu/bin/python
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" -e ".[dev]" \
      && "$PY" -m pip install -q --no-index --find-links "$WHEELS" vllm || true
  else
    "$PY" -m pip install -q --no-deps --no-build-isolation -e . \
      || { echo "cannot import agentgym with $PY; set PYTHON or WHEELS" >&2; exit 2; }
  fi
fi
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

if [ "$DRY" = 1 ]; then
  export CUDA_VISIBLE_DEVICES="" AGENTGYM_CHECK_DEVICE=cpu
  DEVICE=cpu MODEL=tiny-random LEARNER_ARGS="--tasks 1 --group 4 --repeats 1"
  ROLLOUT_ARGS="--tasks 2 --group-size 2 --max-new-tokens 16 --backends hf,tutorial"
else
  if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device here; run with --dry-run for the CPU check" >&2
    exit 2
  fi
  export AGENTGYM_CHECK_DEVICE=cuda
  DEVICE=cuda MODEL=smollm2-shaped LEARNER_ARGS="--repeats 3"
  ROLLOUT_ARGS="--tasks 8 --group-size 4"
  "$PY" -c "import vllm" 2>/dev/null || ROLLOUT_ARGS="$ROLLOUT_ARGS --backends hf,tutorial"
fi

FAILED=0
step() {  # step NAME COMMAND...: runs it, logs it, notes its status and seconds
  local name=$1; shift
  local start=$SECONDS
  echo "== $name: $*" | tee -a "$SUMMARY"
  if "$@" > "$OUT/$name.log" 2>&1; then
    echo "   ok in $((SECONDS - start)) s" | tee -a "$SUMMARY"
  else
    echo "   FAILED in $((SECONDS - start)) s; see $OUT/$name.log" | tee -a "$SUMMARY"
    tail -n 20 "$OUT/$name.log" | sed 's/^/   | /' | tee -a "$SUMMARY"
    FAILED=1
  fi
}

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv > "$OUT/gpu.txt" 2>&1
step machine "$PY" -c "
import importlib.util, torch
cuda = torch.cuda.is_available()
print('torch', torch.__version__, 'cuda', cuda,
      torch.cuda.get_device_name(0) if cuda else '-',
      'bf16', cuda and torch.cuda.is_bf16_supported(),
      'vllm', importlib.util.find_spec('vllm') is not None)"
step gpu_tests "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu.py
if "$PY" -c "import vllm" 2>/dev/null; then
  step vllm_tests "$PY" -m pytest -q -p no:cacheprovider -rs tests/test_vllm.py tests/test_vllm_async.py
else
  echo "== vllm_tests: skipped (vLLM does not import with $PY)" | tee -a "$SUMMARY"
fi
# shellcheck disable=SC2086  # the argument lists split on purpose
step learner_bench "$PY" bench/learner.py --model "$MODEL" --device "$DEVICE" $LEARNER_ARGS
# shellcheck disable=SC2086
step rollout_bench "$PY" bench/rollout.py --model "$MODEL" --device "$DEVICE" $ROLLOUT_ARGS

for name in machine learner_bench rollout_bench; do
  if [ -f "$OUT/$name.log" ]; then
    echo "-- $name" >> "$SUMMARY"
    grep -v -i "warn" "$OUT/$name.log" | tail -n 8 >> "$SUMMARY"
  fi
done
echo "summary: $SUMMARY"
exit $FAILED
