#!/usr/bin/env bash
# Sabotage that must be caught: plants one bug at a time in the code, runs the tests that
# guard against it, and fails unless at least one of them fails. The tree is restored after
# each (and on any exit), so a run leaves `git diff` as it found it.
#
#   bash tests/sabotage.sh            # all of them (make test runs this)
#   PYTHON=.venv/bin/python bash tests/sabotage.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
backup=$(mktemp -d)
restore() { [ -n "${target:-}" ] && [ -f "$backup/file" ] && cp "$backup/file" "$target"; }
trap 'restore; rm -rf "$backup"' EXIT
trap 'exit 130' INT TERM
missed=0

# sabotage NAME FILE OLD NEW TEST...: replaces the one occurrence of OLD in FILE by NEW,
# runs pytest on TEST... and expects a failing test (exit 1; an import error does not count).
sabotage() {
    local name=$1 file=$2 old=$3 new=$4
    shift 4
    target=$file
    cp "$file" "$backup/file"
    OLD=$old NEW=$new "$PYTHON" - "$file" <<'EOF' || { echo "sabotage: $name: the code to break is gone from $file; update tests/sabotage.sh"; exit 2; }
import os, sys
path, old, new = sys.argv[1], os.environ["OLD"], os.environ["NEW"]
text = open(path).read()
if text.count(old) != 1:
    sys.exit(1)
open(path, "w").write(text.replace(old, new))
EOF
    local started=$SECONDS rc
    "$PYTHON" -m pytest -x -q -p no:cacheprovider "$@" >"$backup/log" 2>&1
    rc=$?
    restore
    target=""
    if [ "$rc" -eq 1 ]; then
        echo "sabotage: $name: caught ($(grep -m1 '^FAILED' "$backup/log" | cut -c1-120); $((SECONDS - started)) s)"
    else
        echo "sabotage: $name: NOT caught (pytest exit $rc)"
        tail -n 5 "$backup/log"
        missed=$((missed + 1))
    fi
}

sabotage "the advantage's sign flipped inside the learner" agentgym/learn/learner.py \
    "            micro.advantages," "            -micro.advantages," \
    tests/test_learner_gradient.py

sabotage "one micro-batch's weight halved" agentgym/learn/learner.py \
    "            weight = self._weight(micro, batch)" \
    "            weight = self._weight(micro, batch) * (0.5 if micro.input_ids.shape[1] == batch.input_ids.shape[1] else 1.0)" \
    tests/test_learner_gradient.py

sabotage "the scheduler's state left out of the resume" agentgym/learn/learner.py \
    '        self.scheduler.load_state_dict(state["scheduler"])' '        pass' \
    tests/test_resume.py::test_n_steps_then_resume_for_m_more_is_bitwise_one_run_of_n_plus_m

sabotage "the loss mask shifted by one token (rollout)" agentgym/rollout/episodes.py \
    "        loss_mask=tuple(ep.loss_mask)," "        loss_mask=(0, *ep.loss_mask[:-1])," \
    tests/test_rollout.py tests/test_tool_rollout.py

sabotage "the loss mask shifted by one token (batch)" agentgym/types.py \
    "torch.tensor(t.loss_mask[1:], dtype=torch.float32)" \
    "torch.tensor(t.loss_mask[:-1], dtype=torch.float32)" \
    tests/test_rollout.py tests/test_learner.py

if [ "$missed" -gt 0 ]; then
    echo "sabotage: $missed planted bug(s) passed the tests"
    exit 1
fi
echo "sabotage: every planted bug was caught"
