#!/bin/bash
# reward.json: the share of $CASES cases passed, and "reward" 1 only if all pass.
python3 /tests/check.py > /logs/verifier/reward.json
