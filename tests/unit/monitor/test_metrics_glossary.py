"""The metrics glossary (rlvr/monitor/glossary.py, shown in docs/metrics.md) cannot drift from the code.

The metric keys are collected from rlvr/'s source: the keys of dicts and dict comprehensions that are
returned, or assigned to, updated into or stored in a name that holds `metric` (or `out`), as string
literals or f-string templates (`f"reward/{name}/mean"` reads `reward/{}/mean`; a local name bound
to a string is followed). A key without a `/` counts only in a `metrics` dict. Every key found must
match a glossary entry, and every entry must match a key found.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from rlvr.monitor.glossary import GLOSSARY, render_markdown

ROOT = Path(__file__).resolve().parents[3]
METRICISH = re.compile(r"metric|^out$")
LOGGED_BY_EVERY_ROW = {"step", "time"}  # rlvr/monitor/metrics.py's MetricsLogger.log adds them
DOCS_BEGIN = "<!-- metrics: generated from rlvr/monitor/glossary.py by tests/unit/monitor/test_metrics_glossary.py -->"
DOCS_END = "<!-- end of metrics -->"


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _render(node: ast.AST | None, env: dict[str, str]) -> str | None:
    """A string expression as a template: literal text, `{}` for each part only known at run time."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _escape(node.value)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(_escape(str(value.value)))
            elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name):
                parts.append(env.get(value.value.id, "{}"))
            else:
                parts.append("{}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _render(node.left, env), _render(node.right, env)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Name):
        return env.get(node.id, "{}")
    if isinstance(node, ast.Call):
        return "{}"
    return None


def _name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _dict_keys(node: ast.AST) -> list[ast.AST]:
    """The keys of a dict display or comprehension, `**{...}` parts included."""
    if isinstance(node, ast.DictComp):
        return [node.key]
    if not isinstance(node, ast.Dict):
        return []
    keys: list[ast.AST] = []
    for key, value in zip(node.keys, node.values, strict=True):
        keys.extend([key] if key is not None else _dict_keys(value))
    return keys


def _function_keys(fn: ast.FunctionDef | ast.AsyncFunctionDef, where: str) -> list[tuple[str, str]]:
    env: dict[str, str] = {}  # local names bound to a string
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            env[node.targets[0].id] = _render(node.value, {}) or "{}"
    found: list[tuple[str, str]] = []

    def add(key: ast.AST, flat_ok: bool, line: int) -> None:
        text = _render(key, env)
        if text is not None and text != "{}" and ("/" in text or flat_ok):
            found.append((text, f"{where}:{line}"))

    for node in ast.walk(fn):
        if isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Subscript) and METRICISH.search(_name(target.value)):
                    add(target.slice, "metric" in _name(target.value), node.lineno)
            named = [_name(t) for t in targets if METRICISH.search(_name(t))]
            for key in _dict_keys(node.value) if named else []:
                add(key, any("metric" in n for n in named), node.lineno)
        elif isinstance(node, ast.Return) and node.value is not None:
            for key in _dict_keys(node.value):
                add(key, False, node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update":
            owner = _name(node.func.value)
            if METRICISH.search(owner):
                for key in (k for arg in node.args for k in _dict_keys(arg)):
                    add(key, "metric" in owner, node.lineno)
    return found


def metric_keys(path: Path) -> list[tuple[str, str]]:
    """(template, where) for each metric key `path` produces."""
    where = str(path.relative_to(ROOT))
    return [
        key
        for fn in ast.walk(ast.parse(path.read_text()))
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        for key in _function_keys(fn, where)
    ]


def code_keys() -> list[tuple[str, str]]:
    return [k for path in sorted((ROOT / "rlvr").rglob("*.py")) for k in metric_keys(path)]


def template_regex(template: str) -> re.Pattern[str]:
    """`reward/{}/mean` -> a regex a concrete key of that template matches."""
    parts = template.split("{}")
    return re.compile(".+".join(re.escape(p.replace("{{", "{").replace("}}", "}")) for p in parts) + r"\Z")


def example(entry: str) -> str:
    """A glossary name as a concrete key: `reward/<domain>/mean` -> `reward/d/mean`."""
    return re.sub(r"<[^>]+>", "d", entry)


def test_every_metric_the_code_logs_is_in_the_glossary():
    examples = [example(m.name) for m in GLOSSARY]
    missing = sorted(
        {f"{t}  ({where})" for t, where in code_keys() if not any(template_regex(t).match(e) for e in examples)}
    )
    assert not missing, "metrics the code logs that rlvr/monitor/glossary.py lacks:\n" + "\n".join(missing)


def test_every_glossary_entry_is_a_metric_the_code_logs():
    regexes = [template_regex(t) for t, _ in code_keys()]
    stale = [
        m.name
        for m in GLOSSARY
        if m.name not in LOGGED_BY_EVERY_ROW and not any(r.match(example(m.name)) for r in regexes)
    ]
    assert not stale, f"glossary entries no code logs (remove or rename them): {stale}"


def test_the_scan_finds_the_metrics_it_should():
    """A guard on the scanner itself: keys from each way the code builds them."""
    found = {t for t, _ in code_keys()}
    for key in ("loss", "mismatch_kl", "reward/mean", "reward/{}/mean", "sync/gb_per_s", "groups/{}",
                "data/{}/dropped", "tools/{}/latency_s", "eval/{}/pass@{}", "reward/{}/sub/{}", "time/step"):  # fmt: skip
        assert key in found, key


def test_glossary_names_are_unique_and_described():
    names = [m.name for m in GLOSSARY]
    assert len(names) == len(set(names))
    for m in GLOSSARY:
        assert m.meaning and m.healthy and "|" not in m.meaning + m.healthy, m.name


def test_the_metrics_page_shows_the_glossary():
    page = ROOT / "docs" / "metrics.md"
    text = page.read_text()
    assert DOCS_BEGIN in text and DOCS_END in text, "docs/metrics.md lost its generated section's markers"
    head, rest = text.split(DOCS_BEGIN, 1)
    current, tail = rest.split(DOCS_END, 1)
    wanted = "\n" + render_markdown()
    if os.environ.get("RLVR_UPDATE_DOCS") == "1" and current != wanted:
        page.write_text(head + DOCS_BEGIN + wanted + DOCS_END + tail)
        current = wanted
    assert current == wanted, (
        "docs/metrics.md differs from rlvr/monitor/glossary.py; rewrite it with "
        "RLVR_UPDATE_DOCS=1 pytest tests/unit/monitor/test_metrics_glossary.py"
    )
