import json
import os
import sys

sys.path.insert(0, "/app")
cases = [([1, 2, 3], 6), ([5], 5), ([], 0)][: int(os.environ["CASES"])]
try:
    from total import total

    passed = sum(total(list(xs)) == want for xs, want in cases)
except Exception:
    passed = 0
print(json.dumps({"reward": float(passed == len(cases)), "cases": passed / len(cases)}))
