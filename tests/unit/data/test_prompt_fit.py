"""The prompt count `rlvr validate` makes without transformers agrees with the worker's tokenizer.

`FastTokenizer` reads tokenizer.json with `tokenizers` and renders the chat template with jinja2
as transformers does; the rollout encodes prompts with transformers' `AutoTokenizer`. If the two
disagreed, validate would warn about rows the run keeps (or miss rows it drops).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlvr.data.chat import encode_prompt, render_prompt
from rlvr.data.prompt_fit import fit_prompts, has_rows, prompt_lengths
from rlvr.data.sources import load_domain_samples
from rlvr.recipe.tokenizer import FastTokenizer, load_tokenizer
from rlvr.types import Sample

ROOT = Path(__file__).resolve().parents[3]
POLICY = ROOT / "recipes" / "quickstart" / "policy"
DATA = ROOT / "recipes" / "quickstart" / "data"

# Qwen2.5's template, cut to what a prompt uses: a default system message, special tokens as
# variables, loop state, `raise_exception`, `tojson` and whitespace control.
QWEN_LIKE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<bos>system\\n' + messages[0]['content'] + '<eos>\\n' }}"
    "{%- else %}{{- '<bos>system\\nYou are a helpful assistant.<eos>\\n' }}{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.role not in ('system', 'user', 'assistant') %}{{ raise_exception('bad role') }}{% endif %}\n"
    "    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}\n"
    "        {{- bos_token + message.role + '\\n' + message.content + eos_token + '\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- bos_token + 'assistant' + {'k': 1} | tojson + '\\n' }}{%- endif %}\n"
)


def rows() -> list[Sample]:
    out = []
    for name in ("math", "code", "words"):
        for split in ("train", "eval"):
            out += load_domain_samples(
                [str(DATA / f"{name}_{split}.jsonl")],
                domain=name,
                tags=[name],
                reward="qa_match" if name != "code" else "code_sandbox",
            )
    return out


@pytest.fixture()
def qwen_like(tmp_path: Path) -> Path:
    folder = tmp_path / "qwen_like"
    shutil.copytree(POLICY, folder)
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": QWEN_LIKE}))
    return folder


@pytest.mark.parametrize("template", ["auto", "plain"])
def test_counts_match_transformers_on_the_quickstart_rows(template: str) -> None:
    from transformers import AutoTokenizer

    samples = rows()
    ours = load_tokenizer(POLICY)
    theirs = AutoTokenizer.from_pretrained(str(POLICY))
    assert isinstance(ours, FastTokenizer)
    expected = [len(encode_prompt(s.messages, tokenizer=theirs, template=template)) for s in samples]
    assert prompt_lengths(samples, tokenizer=ours, template=template) == expected
    assert len(samples) == 1320


def test_a_qwen_like_template_renders_as_transformers_renders_it(qwen_like: Path) -> None:
    from transformers import AutoTokenizer

    ours, theirs = FastTokenizer.from_folder(qwen_like), AutoTokenizer.from_pretrained(str(qwen_like))
    conversations = [
        [{"role": "user", "content": "2+2?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  spaced\n\nlines  "}],
        [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}, {"role": "system", "content": "c"}],
    ]
    for messages in conversations:
        assert render_prompt(messages, tokenizer=ours) == render_prompt(messages, tokenizer=theirs)
        assert encode_prompt(messages, tokenizer=ours) == encode_prompt(messages, tokenizer=theirs)
    with pytest.raises(Exception, match="bad role"):
        render_prompt([{"role": "tool", "content": "x"}], tokenizer=ours)


def test_named_templates_use_the_default_one(qwen_like: Path) -> None:
    config = json.loads((qwen_like / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": QWEN_LIKE}]
    (qwen_like / "tokenizer_config.json").write_text(json.dumps(config))
    assert FastTokenizer.from_folder(qwen_like).chat_template == QWEN_LIKE


def test_generation_blocks_render_their_body(qwen_like: Path) -> None:
    """Templates that mark assistant text for training masks still render (as transformers does)."""
    (qwen_like / "chat_template.jinja").write_text(
        "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    )
    assert render_prompt([{"role": "user", "content": "hi"}], tokenizer=FastTokenizer.from_folder(qwen_like)) == "hi"


def test_counting_imports_neither_torch_nor_transformers() -> None:
    import subprocess

    code = (
        "import sys\n"
        "from rlvr.recipe.tokenizer import load_tokenizer\n"
        "from rlvr.data.chat import encode_prompt\n"
        f"tok = load_tokenizer({str(POLICY)!r})\n"
        "assert encode_prompt([{'role': 'user', 'content': 'hi'}], tokenizer=tok)\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=60)


def test_a_large_domain_is_counted_on_a_sample() -> None:
    tokenizer = load_tokenizer(POLICY)
    samples = [Sample(id=str(i), tag="t", messages=[{"role": "user", "content": "x" * (i % 10)}]) for i in range(1000)]
    # "user: " + k x + "\nassistant: " is 18 + k tokens: k >= 5 is over 22, half the rows
    fit = fit_prompts(samples, tokenizer=tokenizer, template="auto", max_tokens=22, sample_rows=200)
    assert fit.rows == 1000 and fit.counted == 200 and fit.sampled
    assert 350 <= fit.estimated_too_long <= 650 and fit.longest == 27
    assert not fit.none_fit
    whole = fit_prompts(samples, tokenizer=tokenizer, template="auto", max_tokens=22)
    assert (whole.counted, whole.too_long, whole.estimated_too_long, whole.shortest) == (1000, 500, 500, 18)


def test_has_rows(tmp_path: Path) -> None:
    (tmp_path / "blank.jsonl").write_text("\n   \n")
    (tmp_path / "one.jsonl").write_text('\n{"prompt": "x"}\n')
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    pq.write_table(pa.table({"prompt": ["x"]}), tmp_path / "one.parquet")
    assert not has_rows(tmp_path / "blank.jsonl") and has_rows(tmp_path / "one.jsonl")
    assert not has_rows(tmp_path / "empty.parquet") and has_rows(tmp_path / "one.parquet")
