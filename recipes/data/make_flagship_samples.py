"""Write the flagship recipe's small sample data in ROLL's field format (run to regenerate).

`messages` and `test_cases` are JSON strings and `difficulty` a string, as in ROLL's
released data, so the loader is exercised on the real shape. The rows are tiny on
purpose: they show the format and let `rlvr plan`/`validate` run; real runs point the
recipe at real data sets.
"""

import json
from pathlib import Path

HERE = Path(__file__).parent
SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."


def chat(user: str, system: str = SYSTEM) -> str:
    return json.dumps([{"role": "system", "content": system}, {"role": "user", "content": user}])


MATH = [
    ("What is 17 + 25?", "42", "1.0"),
    ("Compute 12 * 13.", "156", "1.0"),
    ("Simplify 6/8.", "\\frac{3}{4}", "2.0"),
    ("What is 15% of 80?", "12", "2.0"),
    ("Solve for x: 2x + 3 = 11.", "4", "2.0"),
    ("What is the sum of the interior angles of a hexagon, in degrees?", "720", "3.0"),
    ("Find the positive root of x^2 - 5x + 6 = 0 that is larger.", "3", "3.0"),
    ("What is \\sqrt{144}?", "12", "1.0"),
    ("Give the set of real solutions of x^2 = 9.", "\\{-3, 3\\}", "3.0"),
    ("What is 2^{10}?", "1024", "1.0"),
    ("Evaluate 1/2 + 1/3.", "\\frac{5}{6}", "2.0"),
    ("How many primes are less than 20?", "8", "3.0"),
]
CODE = [
    (
        "Write a program that reads two integers on one line and prints their sum.",
        "stdin_stdout",
        [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4\n", "output": "6\n"}],
    ),
    (
        "Write a program that reads a string and prints it reversed.",
        "stdin_stdout",
        [{"input": "abc\n", "output": "cba\n"}, {"input": "racecar\n", "output": "racecar\n"}],
    ),
    (
        "Write a Python function `is_even(n)` returning True when n is even.",
        "assert",
        ["assert is_even(2)", "assert not is_even(3)", "assert is_even(0)"],
    ),
    (
        "Write a Python function `fib(n)` returning the n-th Fibonacci number with fib(0)=0, fib(1)=1.",
        "assert",
        ["assert fib(0) == 0", "assert fib(1) == 1", "assert fib(10) == 55"],
    ),
    (
        "Write a Python function `max_of(xs)` returning the largest element of a non-empty list.",
        "check_based",
        {
            "test": "def check(candidate):\n    assert candidate([1, 5, 2]) == 5\n    assert candidate([-3]) == -3\n",
            "entry_point": "max_of",
        },
    ),
    (
        "Write a Python function `count_vowels(s)` counting a, e, i, o, u (lowercase).",
        "pytest",
        "from solution import count_vowels\n\ndef test_basic():\n    assert count_vowels('hello') == 2\n\n"
        "def test_empty():\n    assert count_vowels('') == 0\n",
    ),
]
JUDGE = [
    ("Name the largest planet in the solar system and give one fact about it.", "Jupiter"),
    ("Which gas do plants absorb from the air for photosynthesis?", "Carbon dioxide (CO2)"),
    ("Who wrote 'Pride and Prejudice'?", "Jane Austen"),
    ("What is the capital of Australia?", "Canberra"),
    ("What is the chemical symbol for gold?", "Au"),
    ("In which year did the first crewed Moon landing happen?", "1969"),
]


def write(name: str, rows: list[dict]) -> None:
    with (HERE / name).open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def main() -> None:
    math_rows = [
        {
            "id": f"math-{i}",
            "source": "rlvr-sample",
            "difficulty": d,
            "prompt": q,
            "messages": chat(q),
            "ground_truth": a,
            "case_type": "",
            "test_case_function": "",
            "test_cases": "",
            "tag": "math_rule",
        }
        for i, (q, a, d) in enumerate(MATH)
    ]
    code_rows = [
        {
            "id": f"code-{i}",
            "source": "rlvr-sample",
            "difficulty": "1.0",
            "prompt": q,
            "messages": chat(q, "Answer with one ```python code block."),
            "ground_truth": "",
            "case_type": kind,
            "test_case_function": "",
            "test_cases": json.dumps(cases),
            "tag": "code_sandbox",
        }
        for i, (q, kind, cases) in enumerate(CODE)
    ]
    judge_rows = [
        {
            "id": f"judge-{i}",
            "source": "rlvr-sample",
            "difficulty": "1.0",
            "prompt": q,
            "messages": chat(q, "Answer briefly and correctly."),
            "ground_truth": a,
            "case_type": "",
            "test_case_function": "",
            "test_cases": "",
            "tag": "llm_judge",
        }
        for i, (q, a) in enumerate(JUDGE)
    ]
    write("math_train.jsonl", math_rows[:9])
    write("math_eval.jsonl", math_rows[9:])
    write("code_train.jsonl", code_rows[:5])
    write("code_eval.jsonl", code_rows[5:])
    write("judge_train.jsonl", judge_rows[:5])
    write("judge_eval.jsonl", judge_rows[5:])


if __name__ == "__main__":
    main()
