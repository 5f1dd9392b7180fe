"""Which code in a response `code_sandbox` runs: the program, found among its fenced blocks.

Instruct models follow a solution with usage, sample input or a second attempt, so running only
the last block scores a right solution 0 and running every block lets the usage break it. The rule
(`find_program`): of the Python blocks that parse, the program is the last one that defines what
the tests call (for `stdin_stdout`, the last that reads stdin); the earlier blocks that define
something and read no stdin run before it; later blocks, and blocks that only call, print or
assert, do not run. With no program block the last Python block runs as it is, so the reason names
what is wrong. The choice reads only the text, and one program runs, so several attempts never get
several chances. A fence left open at the end is the last block, unless the response was cut at
`max_new_tokens`. The rule in full, and why: docs/rewards.md (code_sandbox, "Which code runs").
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass, field
from typing import Any

# An info string holds no backtick (CommonMark), which also keeps a run of backticks linear to scan.
_FENCE_RE = re.compile(r"```[ \t]*([\w+.-]*)[^\n`]*\n(.*?)```", re.DOTALL)
_OPEN_FENCE_RE = re.compile(r"```[ \t]*([\w+.-]*)[^\n`]*\n((?:(?!```).)*)\Z", re.DOTALL)
_PY_LANGS = {"", "python", "py", "python3", "py3"}
_BUILTINS = frozenset(dir(builtins))
_STDIN_HINT = re.compile(r"input|stdin|open|fileinput")  # a block without these cannot read stdin
TRUNCATED = "response truncated inside a code block"
UNCLOSED = "response ends inside an unclosed code block that does not parse"


@dataclass(slots=True)
class Block:
    """One Python block: its code, the names it binds at top level, whether it reads stdin."""

    code: str
    parsed: bool
    binds: set[str] = field(default_factory=set)
    reads_at_top: bool = False  # reads stdin when the block runs (top level, or a call to a reader)
    readers: set[str] = field(default_factory=set)  # functions it defines that read stdin


@dataclass(slots=True)
class Program:
    """The code to run, or None with the reason; `blocks` says which blocks made it (1-based)."""

    code: str | None
    reason: str = ""
    blocks: tuple[int, ...] = ()


def python_blocks(text: str, *, truncated: bool = False) -> tuple[list[str], bool]:
    """(the Python blocks' code in order, whether the text ends inside an open Python fence).

    An open final fence counts as the last block unless the response was `truncated` (cut at
    the token limit): then its code is incomplete and is left out.
    """
    blocks = [body for lang, body in _FENCE_RE.findall(text) if lang.lower() in _PY_LANGS]
    closed_end = 0
    for match in _FENCE_RE.finditer(text):
        closed_end = match.end()
    tail = _OPEN_FENCE_RE.search(text, closed_end)
    open_python = tail is not None and tail.group(1).lower() in _PY_LANGS and bool(tail.group(2).strip())
    if open_python and tail is not None and not truncated:
        blocks.append(tail.group(2))
    return blocks, open_python


def _reads_stdin(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id == "input":
            return True
        if isinstance(sub, ast.Attribute) and sub.attr in ("stdin", "buffer") and _is_sys_stdin(sub):
            return True
        if isinstance(sub, ast.ImportFrom) and sub.module == "sys" and any(a.name == "stdin" for a in sub.names):
            return True
        if isinstance(sub, ast.Import) and any(a.name == "fileinput" for a in sub.names):
            return True
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Name)
            and sub.func.id == "open"
            and sub.args
            and isinstance(sub.args[0], ast.Constant)
            and sub.args[0].value == 0
        ):
            return True
    return False


def _is_sys_stdin(node: ast.Attribute) -> bool:
    return node.attr == "stdin" or (isinstance(node.value, ast.Attribute) and node.value.attr == "stdin")


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """Top-level statements, looking into if/try/with/for/while (not into def or class bodies)."""
    out: list[ast.stmt] = []
    todo = list(reversed(tree.body))  # a stack: the next statement is last
    while todo:
        stmt = todo.pop()
        out.append(stmt)
        inner: list[ast.stmt] = []
        if isinstance(stmt, ast.If | ast.For | ast.AsyncFor | ast.While | ast.With | ast.AsyncWith):
            inner = [*stmt.body, *getattr(stmt, "orelse", [])]
        elif isinstance(stmt, ast.Try):
            inner = [*stmt.body, *(s for h in stmt.handlers for s in h.body), *stmt.orelse, *stmt.finalbody]
        todo.extend(reversed(inner))
    return out


def _targets(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _binds(stmts: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for stmt in stmts:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in stmt.names if a.name != "*")
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                names |= _targets(target)
        elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
            names |= _targets(stmt.target)
    return names


def _calls(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names for n in ast.walk(node))


def _block(code: str, readers: set[str]) -> Block:
    """A block's facts; `readers` are the stdin-reading functions earlier blocks defined."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return Block(code, parsed=False)
    stmts = _top_level(tree)
    if not _STDIN_HINT.search(code) and not any(name in code for name in readers):  # nothing could read stdin
        return Block(code, parsed=True, binds=_binds(stmts))
    defs = [s for s in stmts if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)]
    known = set(readers)
    changed = True
    while changed:  # a function reads stdin if its body does or it calls one that does
        new = {d.name for d in defs if d.name not in known and (_reads_stdin(d) or _calls(d, known))}
        known |= new
        changed = bool(new)
    reads = False
    for stmt in stmts:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        part = _header(stmt) if hasattr(stmt, "body") else stmt  # a compound's body is listed on its own
        if part is not None and (_reads_stdin(part) or _calls(part, known)):
            reads = True
    return Block(code, parsed=True, binds=_binds(stmts), reads_at_top=reads, readers=known - readers)


def _header(stmt: ast.stmt) -> ast.AST | None:
    """The part of a compound statement that runs itself (its test, iterator, context), not its body."""
    if isinstance(stmt, ast.If | ast.While):
        return stmt.test
    if isinstance(stmt, ast.For | ast.AsyncFor):
        return stmt.iter
    if isinstance(stmt, ast.With | ast.AsyncWith):
        return ast.Tuple(elts=[item.context_expr for item in stmt.items], ctx=ast.Load())
    return None


def names_the_tests_call(case_type: str | None, cases: Any) -> set[str] | None:
    """The solution names the tests call; None where they cannot be read (stdin_stdout, `import *`)."""
    if case_type == "check_based" and isinstance(cases, dict):
        return {str(cases.get("entry_point", ""))} - {""}
    if case_type == "pytest" and isinstance(cases, str):
        try:
            tree = ast.parse(cases)
        except (SyntaxError, ValueError):
            return None
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "solution":
                if any(a.name == "*" for a in node.names):
                    return None
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "solution":
                names.add(node.attr)
        return names or None
    if case_type == "assert":
        lines = [cases] if isinstance(cases, str) else cases if isinstance(cases, list) else []
        names = set()
        for line in lines:
            try:
                tree = ast.parse(str(line))
            except (SyntaxError, ValueError):
                continue
            loads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            local = _targets(tree) | {
                a.arg for n in ast.walk(tree) if isinstance(n, ast.Lambda | ast.FunctionDef) for a in n.args.args
            }
            local |= {
                (a.asname or a.name).split(".")[0]
                for n in ast.walk(tree)
                if isinstance(n, ast.Import | ast.ImportFrom)
                for a in n.names
            }
            names |= loads - local - _BUILTINS
        return names or None
    return None


def find_program(text: str, case_type: str | None, cases: Any, *, truncated: bool = False) -> Program:
    """The code `code_sandbox` runs for a response (see the module docstring for the rule)."""
    codes, open_at_end = python_blocks(text, truncated=truncated)
    cut = truncated and open_at_end
    if not codes:
        return Program(None, TRUNCATED if cut else "no code block found")
    blocks: list[Block] = []
    readers: set[str] = set()
    for code in codes:
        block = _block(code, readers)
        readers |= block.readers
        blocks.append(block)
    if case_type == "stdin_stdout":
        anchor = next((i for i in reversed(range(len(blocks))) if blocks[i].reads_at_top), None)
    else:
        names = names_the_tests_call(case_type, cases)
        anchor = next(
            (i for i in reversed(range(len(blocks))) if blocks[i].binds and (names is None or blocks[i].binds & names)),
            None,
        )
    if anchor is None:
        if cut:
            return Program(None, TRUNCATED)
        if open_at_end and not blocks[-1].parsed:  # stopped inside a fence, its code incomplete
            return Program(None, UNCLOSED)
        return Program(codes[-1], blocks=(len(codes),))
    chosen = [i for i in range(anchor) if blocks[i].parsed and blocks[i].binds and not blocks[i].reads_at_top]
    chosen.append(anchor)
    code = "\n".join(blocks[i].code.rstrip("\n") + "\n" for i in chosen)
    return Program(code, blocks=tuple(i + 1 for i in chosen))
