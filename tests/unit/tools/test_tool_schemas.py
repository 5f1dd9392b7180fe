"""A domain's `tool_schemas`: the recipe declares a tool's schema (the one a tool-tuned model was
trained with) in place of the one rlvr derives from a plug-in's signature and docstring. The prompt
lists it and calls are checked against it; a schema for no tool of the domain, an unknown key or
parameters that are not a JSON schema object are one-line recipe errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.recipe.schema import DomainConfig
from rlvr.tools.base import ToolError
from rlvr.tools.registry import build_tools
from rlvr.tools.session import Toolbox
from tests.unit.recipe.helpers import MINIMAL, write_recipe

PLUGIN = "tests.unit.tools.plugin_example:lookup_price"
DECLARED = {
    "description": "Price in cents of some fruit.",
    "parameters": {
        "type": "object",
        "properties": {"item": {"type": "string", "enum": ["apple", "pear"]}},
        "required": ["item"],
    },
}


def _domain(**schemas) -> DomainConfig:
    return DomainConfig(tags=["m"], files=["x.jsonl"], reward="math_rule", tools=["python", PLUGIN],
                        tool_format="hermes", tool_schemas=schemas)  # fmt: skip


def test_a_declared_schema_replaces_the_derived_one_in_the_prompt_and_the_argument_check():
    tools = build_tools(_domain(lookup_price=DECLARED, python={"description": "Run Python 3.12; prints stdout."}))
    price = tools["lookup_price"]
    assert price.schema()["function"] == {"name": "lookup_price", **DECLARED}
    with pytest.raises(ToolError, match="unknown argument"):  # `quantity` is in the signature, not the schema
        price.check_arguments({"item": "pear", "quantity": 2})
    assert tools["python"].description == "Run Python 3.12; prints stdout."
    assert tools["python"].parameters == build_tools(_domain())["python"].parameters  # only what was declared
    box = Toolbox(tools, tool_format="hermes", tokenizer=None, max_turns=2, max_tool_calls=1, timeout_s=1.0,
                  max_tokens=64)  # fmt: skip
    assert json.dumps(price.schema()) in box.prompt_messages([{"role": "user", "content": "?"}])[0]["content"]


def test_without_a_declared_schema_a_plugins_comes_from_its_signature():
    price = build_tools(_domain())["lookup_price"]
    assert price.description == "Price of a fruit in cents."
    assert set(price.parameters["properties"]) == {"item", "quantity"}


@pytest.mark.parametrize(
    ("schemas", "expected"),
    [
        ('{ lookup = { description = "x" } }', "domains.math.tool_schemas.lookup: not a tool of this domain"),
        ('{ python = { name = "py" } }', "domains.math.tool_schemas.python: unknown key(s) ['name']"),
        ("{ python = { parameters = { properties = {} } } }", "domains.math.tool_schemas.python.parameters: must be"),
    ],
    ids=["unknown-tool", "unknown-key", "not-an-object-schema"],
)
def test_a_bad_declared_schema_is_one_line_and_exit_2(tmp_path: Path, schemas: str, expected: str) -> None:
    braces = schemas.replace("{", "{{").replace("}", "}}")  # write_recipe formats the body
    extra = f'tools = ["python", "{PLUGIN}"]\ntool_format = "hermes"\ntool_schemas = {braces}\n'
    body = MINIMAL.replace('reward = "math_rule"\n', 'reward = "math_rule"\n' + extra, 1)
    result = CliRunner().invoke(app, ["validate", str(write_recipe(tmp_path, body))])
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert expected in message and len(result.stderr.strip().splitlines()) == 1, message
