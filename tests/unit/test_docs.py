"""The README and docs/ stay true: links resolve, the test command is there, examples run.

- Every relative link in README.md and docs/*.md points at a file that exists, and an `#anchor`
  at a heading of that page (GitHub's slugs). Nothing points outside the repository.
- The README holds the test command CI runs (`.ci/run` runs "the README's test command").
- Every ```console block runs: each `$ command` in a fresh shell (cwd: a scratch folder holding
  links to the repository's top-level entries, so `runs/` lands there; no GPU visible, as on the
  machine the pages show), and every line shown under it must appear in its output, in order.
  Matching is loose: box-drawing characters and runs of spaces are ignored, a shown line may be a
  fragment of an output line, and `...` inside a line matches anything (timings, absolute paths).
  `$ echo $?` shows the previous command's exit status. A block opened with ```console slow is
  marked `slow`. Examples that cannot run in seconds go in ```text blocks, which are not run.
- docs/examples/ holds the files the recipe and reward pages show; each page shows them whole.
- docs/recipes.md's key reference is generated from the recipe schema (defaults and docstrings):
  `RLVR_UPDATE_DOCS=1 pytest tests/unit/test_docs.py` rewrites it after a schema change.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TEST_COMMAND = ". .venv/bin/activate && pytest -q"
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
BOX = re.compile(r"[\u2500-\u257f]")
KEYS_BEGIN = "<!-- recipe keys: generated from rlvr/recipe/schema.py by tests/unit/test_docs.py -->"
KEYS_END = "<!-- end of recipe keys -->"


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# -- markdown ----------------------------------------------------------------------------------
@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    info: str
    lines: list[str]


def split_markdown(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str, list[str]]]]:
    """The prose lines (number, text) and the fenced blocks (opening line, info string, lines)."""
    prose: list[tuple[int, str]] = []
    blocks: list[tuple[int, str, list[str]]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(2)
                blocks.append((number, m.group(3).strip(), []))
            else:
                prose.append((number, line))
        elif m and m.group(2).startswith(fence[0]) and len(m.group(2)) >= len(fence) and not m.group(3).strip():
            fence = None
        else:
            blocks[-1][2].append(line)
    assert fence is None, "a fenced block is never closed"
    return prose, blocks


def blocks_of(path: Path, kind: str) -> list[Block]:
    _, blocks = split_markdown(path.read_text())
    return [Block(path, n, info, lines) for n, info, lines in blocks if info.split()[:1] == [kind]]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = split_markdown(path.read_text())
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in prose:
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    prose, _ = split_markdown(path.read_text())
    out = []
    for number, line in prose:
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
        out.extend((number, m.group(1)) for m in LINK.finditer(line))
    return out


def test_the_docs_exist():
    names = {p.name for p in DOC_FILES}
    for page in ("README.md", "architecture.md", "recipes.md", "rewards.md", "cluster.md", "development.md"):
        assert page in names, page


@pytest.mark.parametrize("path", DOC_FILES, ids=rel)
def test_every_relative_link_resolves(path: Path):
    bad = []
    for number, target in links(path):
        if re.match(r"^[a-z][a-z+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        where = f"{rel(path)}:{number}: {target}"
        if not dest.is_relative_to(ROOT):
            bad.append(f"{where}: points outside the repository")
        elif not dest.exists():
            bad.append(f"{where}: no such file")
        elif anchor:
            if dest.suffix != ".md":
                bad.append(f"{where}: an anchor into a file that is not markdown")
            elif anchor not in anchors(dest):
                bad.append(f"{where}: no heading #{anchor} in {rel(dest)}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", DOC_FILES, ids=rel)
def test_every_fenced_block_says_what_it_is(path: Path):
    """```console blocks run; anything else shown as a transcript says ```text, so that an example
    is never left unchecked by accident."""
    _, blocks = split_markdown(path.read_text())
    bare = [n for n, info, _ in blocks if not info]
    assert not bare, f"{rel(path)}: fenced blocks without a language at lines {bare} (console, text, toml, ...)"


@pytest.mark.parametrize("path", DOC_FILES, ids=rel)
def test_nothing_points_at_shared(path: Path):
    assert "../shared" not in path.read_text()


def test_the_readme_holds_the_test_command_ci_runs():
    bash = [line for b in blocks_of(ROOT / "README.md", "bash") for line in b.lines]
    assert TEST_COMMAND in bash, f"the README's ```bash blocks must hold `{TEST_COMMAND}` (CI runs it)"
    assert "pytest -q" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150, "the reference belongs in docs/"


def test_a_newcomer_finds_each_task_in_one_click():
    readme_links = {target for _, target in links(ROOT / "README.md")}
    for target in (
        "#install",
        "#quickstart",
        "docs/recipes.md#write-your-own-recipe",
        "docs/rewards.md#add-a-reward-plug-in",
        "docs/cluster.md#run-on-slurm",
        "docs/index.md",
        "docs/models.md",
        "docs/data.md",
        "docs/one-gpu.md",
        "docs/choose-algorithm.md",
        "docs/choose-engine.md",
        "docs/tools.md",
        "docs/running.md",
        "docs/troubleshooting.md",
        "docs/metrics.md",
        "docs/benchmarks.md",
        "docs/development.md",
    ):
        assert target in readme_links, target


# -- console examples --------------------------------------------------------------------------
def normalise(line: str) -> str:
    return " ".join(BOX.sub(" ", line).split())


def line_pattern(shown: str) -> re.Pattern[str]:
    parts = [re.escape(p) for p in normalise(shown).split("...")]
    return re.compile(".*".join(parts))


@dataclass
class Example:
    command: str
    shown: list[str]


def examples(block: Block) -> list[Example]:
    out: list[Example] = []
    for line in block.lines:
        if line.startswith("$ "):
            out.append(Example(line[2:], []))
        elif line.strip() and normalise(line) != "...":
            assert out, f"{rel(block.path)}:{block.line}: output before the first `$ ` command"
            out[-1].shown.append(line)
    return out


def console_blocks() -> list:
    params = []
    for path in DOC_FILES:
        for block in blocks_of(path, "console"):
            marks = [pytest.mark.slow] if "slow" in block.info.split()[1:] else []
            params.append(pytest.param(block, id=f"{rel(path)}:{block.line}", marks=marks))
    return params


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working folder that sees the repository's files but keeps `runs/` to itself."""
    folder = tmp_path_factory.mktemp("docs")
    for entry in ROOT.iterdir():
        if entry.name not in {"runs", ".git", ".venv"}:
            (folder / entry.name).symlink_to(entry)
    return folder


def run_example(command: str, *, cwd: Path) -> tuple[int, str]:
    # The pages show a machine without GPUs (plans say "on CPU"): a GPU here must not change them.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = dict(os.environ, COLUMNS="100", CUDA_VISIBLE_DEVICES="", PATH=path)
    env.pop("FORCE_COLOR", None)
    proc = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stdout


@pytest.mark.parametrize("block", console_blocks())
def test_console_example_prints_what_the_docs_show(block: Block, scratch: Path):
    where = f"{rel(block.path)}:{block.line}"
    status = 0
    for example in examples(block):
        command = example.command.replace("$?", str(status)) if example.command.startswith("echo ") else example.command
        status, output = run_example(command, cwd=scratch)
        lines = [normalise(line) for line in output.splitlines()]
        at = 0
        for shown in example.shown:
            pattern = line_pattern(shown)
            hit = next((i for i in range(at, len(lines)) if pattern.search(lines[i])), None)
            assert hit is not None, (
                f"{where}: `$ {example.command}` did not print, in order:\n  {shown.strip()}\n"
                f"it printed (exit {status}):\n{output}"
            )
            at = hit + 1


def test_console_blocks_exist_and_parse():
    blocks = [b.values[0] for b in console_blocks()]
    assert len(blocks) >= 5
    for block in blocks:
        assert examples(block), f"{rel(block.path)}:{block.line}: a console block without `$ ` commands"


# -- files the pages show whole ----------------------------------------------------------------
@pytest.mark.parametrize(
    "name", sorted(p.name for p in (ROOT / "docs" / "examples").glob("*") if p.suffix in (".toml", ".py"))
)
def test_the_pages_show_the_example_files_whole(name: str):
    """A block that opens with `# docs/examples/NAME` is that file, byte for byte (the file is what
    the console examples run, so what the page shows is what was tested)."""
    text = (ROOT / "docs" / "examples" / name).read_text().rstrip("\n")
    assert text.startswith(f"# docs/examples/{name}"), f"docs/examples/{name} must open with its own name"
    shown = [
        "\n".join(b.lines)
        for path in DOC_FILES
        for kind in ("toml", "python")
        for b in blocks_of(path, kind)
        if b.lines and b.lines[0].startswith(f"# docs/examples/{name}")
    ]
    assert shown, f"no page shows docs/examples/{name}"
    for block in shown:
        assert block == text, f"a page shows docs/examples/{name} differently from the file"


# -- the recipe key reference ------------------------------------------------------------------
def toml_value(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }" if value else "{}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def section_model(annotation: object) -> type | None:
    """The recipe table a field holds, if any (`rollout.sglang`, `trainer.lora`, `domains.NAME`)."""
    from pydantic import BaseModel

    candidates = [annotation]
    while candidates:
        a = candidates.pop()
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
        if typing.get_origin(a) in (typing.Union, types.UnionType, dict, list):
            candidates.extend(typing.get_args(a))
    return None


def render_keys() -> str:
    """Every recipe key with its default and docstring, one table per recipe table."""
    from pydantic_core import PydanticUndefined

    from rlvr.recipe.schema import Recipe

    out: list[str] = []

    def table(prefix: str, model: type) -> None:
        rows, nested = [], []
        for name, field in model.model_fields.items():  # type: ignore[attr-defined]
            sub = section_model(field.annotation)
            key = f"{prefix}.{name}" if prefix else name
            if sub is not None:
                nested.append((f"{key}.NAME" if typing.get_origin(field.annotation) is dict else key, sub))
                continue
            if field.default is not PydanticUndefined:
                default = toml_value(field.default)
            elif field.default_factory is not None:
                default = toml_value(field.default_factory())
            else:
                default = "required"
            doc = " ".join((field.description or "").split()).replace("|", "\\|")
            rows.append(f"| `{key}` | `{default}` | {doc} |")
        if rows:
            out.extend([f"### `[{prefix}]`", "", "| key | default | what it does |", "|---|---|---|", *rows, ""])
        for key, sub in nested:
            table(key, sub)

    table("", Recipe)
    return "\n".join(out).rstrip() + "\n"


def check_generated_section(page: Path, begin: str, end: str, wanted: str, *, differs: str) -> None:
    """The text between `begin` and `end` in `page` is `wanted` (RLVR_UPDATE_DOCS=1 rewrites it first);
    `differs` says what differs and how to rewrite it."""
    text = page.read_text()
    assert begin in text and end in text, f"{rel(page)} lost its generated section's markers"
    head, rest = text.split(begin, 1)
    current, tail = rest.split(end, 1)
    if os.environ.get("RLVR_UPDATE_DOCS") == "1" and current != wanted:
        page.write_text(head + begin + wanted + end + tail)
        current = wanted
    assert current == wanted, f"{rel(page)}: {differs}"


def test_the_recipe_page_lists_every_key_as_the_schema_says():
    check_generated_section(
        ROOT / "docs" / "recipes.md", KEYS_BEGIN, KEYS_END, "\n" + render_keys(),
        differs="the key reference differs from rlvr/recipe/schema.py; rewrite it with RLVR_UPDATE_DOCS=1 pytest "
        "tests/unit/test_docs.py",
    )  # fmt: skip
