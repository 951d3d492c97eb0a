"""The rows `agentgym/Tasks-v0` plays without `data`: a small arithmetic set for first tries.

It is there so that `gymnasium.make("agentgym/Tasks-v0")` works as for every
registered environment (the checkers make each one without arguments); a run
meant to learn something names its own `data`.
"""

from __future__ import annotations

SAMPLE_ROWS: tuple[dict[str, str], ...] = (
    {"prompt": "What is 17 + 25?", "answer": "42"},
    {"prompt": "What is 9 * 8?", "answer": "72"},
    {"prompt": "What is 144 / 12?", "answer": "12"},
    {"prompt": "What is 100 - 37?", "answer": "63"},
    {"prompt": "What is 15% of 80?", "answer": "12"},
    {"prompt": "What is 2 to the power of 10?", "answer": "1024"},
    {"prompt": "What is the square root of 169?", "answer": "13"},
    {"prompt": "What is 3/4 + 1/8? Give a fraction.", "answer": "7/8"},
    {"prompt": "A pen costs 3 dollars. How much do 7 pens cost, in dollars?", "answer": "21"},
    {"prompt": "Sam has 12 apples and gives away 5. How many are left?", "answer": "7"},
    {
        "prompt": "A train travels 60 km per hour for 3 hours. How many km does it go?",
        "answer": "180",
    },
    {"prompt": "What is the sum of the first 10 positive integers?", "answer": "55"},
    {"prompt": "What is 11 * 11?", "answer": "121"},
    {"prompt": "What is 1000 - 1?", "answer": "999"},
    {"prompt": "What is half of 86?", "answer": "43"},
    {"prompt": "How many minutes are in 4 hours?", "answer": "240"},
    {"prompt": "How many sides do 3 hexagons have in total?", "answer": "18"},
    {"prompt": "What is 0.5 + 0.25?", "answer": "0.75"},
    {"prompt": "What is 7 squared minus 7?", "answer": "42"},
    {"prompt": "A box holds 6 eggs. How many boxes do 54 eggs fill?", "answer": "9"},
    {"prompt": "What is 13 * 3 + 1?", "answer": "40"},
    {"prompt": "What is the remainder of 50 divided by 7?", "answer": "1"},
    {"prompt": "What is 5 factorial?", "answer": "120"},
    {"prompt": "What is 81 / 9 - 4?", "answer": "5"},
)
"""24 rows in the `prompt` / `answer` shape `Tasks-v0` reads by default."""
