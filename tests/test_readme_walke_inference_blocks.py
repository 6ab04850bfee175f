"""Each Python block of the README's "Inference: embedded engine, HTTP server, vLLM" section
runs on its own, as written, in a fresh process and directory: a reader who comes to the
streaming paragraph copies that block alone. It read `asyncio`, `ChatRequest`,
`SamplingConfig`, `EmbeddedEngine`, `model` and `tokenizer` from the section's first block,
so alone it stopped at a NameError. (`tests/test_readme.py` runs every block in order in one
namespace, which such a block passes.)"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.test_readme_pieces_blocks import README, free_names, section_blocks

SECTION = "## Inference: embedded engine, HTTP server, vLLM"


def _blocks() -> list[str]:
    return section_blocks(README.read_text(encoding="utf-8"), SECTION)


def test_the_section_has_its_two_python_blocks() -> None:
    assert len(_blocks()) == 2, "the section's Python blocks changed: check the tests below"


@pytest.mark.parametrize("index", [0, 1], ids=["engine-and-client", "streaming"])
def test_each_block_binds_every_name_it_reads(index: int) -> None:
    assert free_names(_blocks()[index]) == set()


@pytest.mark.parametrize("index", [0, 1], ids=["engine-and-client", "streaming"])
def test_each_block_runs_alone_in_a_fresh_process(tmp_path: Path, index: int) -> None:
    (tmp_path / "block.py").write_text(_blocks()[index])
    result = subprocess.run(
        [sys.executable, "block.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout.strip().splitlines()
    assert printed, "the block printed nothing"
    if index == 0:  # prompt ids, 16 completion ids, their logprobs, policy version 0
        prompt, completion, logprobs, version = ast.literal_eval(
            printed[-1].replace(") (", "), (").replace(") ", "), ")
        )
        assert len(completion) == len(logprobs) == 16 and prompt and version == 0
    else:  # one line per delta: its token ids and their logprobs
        deltas = [ast.literal_eval(line.replace(") (", "), (")) for line in printed]
        assert all(len(ids) == len(logprobs) for ids, logprobs in deltas)
        assert 1 <= sum(len(ids) for ids, _ in deltas) <= 16
