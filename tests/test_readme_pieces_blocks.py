"""The Python blocks of the README's tour of the pieces ("An episode in twenty lines",
"Environments, agents and protocols", "From rollouts to samples") each run on their own: a
reader who starts at one of these sections copies one block into a fresh file. Every name a
block reads is a builtin or bound in the block itself (the rollouts block used `Agent`,
`env_parser`, `SingleAgentProtocol`, `TicTacToeEnv` and `asyncio` from the block before it,
a NameError on its own). `tests/test_readme.py` runs them, in order, in one session."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SECTIONS = (
    "## An episode in twenty lines",
    "## Environments, agents and protocols",
    "## From rollouts to samples",
)


def section_blocks(text: str, heading: str) -> list[str]:
    if heading not in text:
        raise AssertionError(f"README has no {heading!r} section")
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```python\n(.*?)^```$", section, flags=re.S | re.M)


def free_names(code: str) -> set[str]:
    """Names read but never bound anywhere in `code` (scopes merged: enough for a flat block)."""
    tree = ast.parse(code)
    bound: set[str] = set()
    read: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return read - bound - set(dir(builtins))


@pytest.mark.parametrize("heading", SECTIONS)
def test_each_block_of_the_tour_binds_every_name_it_reads(heading: str) -> None:
    blocks = section_blocks(README.read_text(encoding="utf-8"), heading)
    assert blocks, f"{heading!r} has no Python block"
    for block in blocks:
        assert free_names(block) == set(), f"{heading}: a block reads names it never binds"


def test_free_names_sees_what_a_block_takes_from_an_earlier_one() -> None:
    code = "import copy\ndef f(x):\n    return Agent(copy.copy(x), y)\ny = [z for z in range(3)]\n"
    assert free_names(code) == {"Agent"}
