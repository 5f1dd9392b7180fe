from __future__ import annotations

import textwrap
from pathlib import Path

MINIMAL = """
[experiment]
name = "t"
max_steps = 3

[model]
config = {{ hidden_size = 32 }}

[data]
prompts_per_step = 4
domain_interleave_probs = {{ math = 0.75, code = 0.25 }}

[domains.math]
tags = ["math"]
files = ["{math}"]
reward = "math_rule"

[domains.code]
tags = ["code"]
files = ["{code}"]
reward = "code_sandbox"

[rollout]
n = 2
temperature = 0.7
"""

MATH_ROWS = [
    '{"id": "m1", "tag": "math", "prompt": "1+1?", "ground_truth": "2"}',
    '{"id": "m2", "tag": "math", "messages": [{"role": "user", "content": "2+2?"}], "ground_truth": "4"}',
    '{"id": "m3", "tag": "math", "messages": "[{\\"role\\": \\"user\\", \\"content\\": \\"3+3?\\"}]", "ground_truth": "6"}',
]
CODE_ROWS = [
    '{"id": "c1", "tag": "code", "prompt": "print 1", "case_type": "stdin_stdout", "test_cases": [{"input": "", "output": "1"}]}',
]


def write_recipe(tmp: Path, body: str = MINIMAL, *, math_rows=MATH_ROWS, code_rows=CODE_ROWS) -> Path:
    (tmp / "math.jsonl").write_text("\n".join(math_rows) + "\n")
    (tmp / "code.jsonl").write_text("\n".join(code_rows) + "\n")
    path = tmp / "recipe.toml"
    path.write_text(textwrap.dedent(body).format(math="math.jsonl", code="code.jsonl"))
    return path


def one_error_line(result) -> str:
    """The CLI's answer to a bad input: exit 2, no traceback, and exactly one line on stderr."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]
