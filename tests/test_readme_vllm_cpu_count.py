"""The README's "Verified on a real vLLM, on CPU" paragraph says how many tests
`scripts/test_vllm_cpu.sh` ran when it last passed; it said 7 while the file held 9 (two were
added after the count was written). The count must be the number of tests in
`tests/inference/test_vllm_cpu.py`, which the script runs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tests_in(path: Path) -> int:
    tree = ast.parse(path.read_text())
    return sum(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
        for node in tree.body
    )


def test_the_readme_counts_the_vllm_cpu_tests() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    found = re.search(r"`scripts/test_vllm_cpu\.sh` on an existing venv: its (\d+) tests", readme)
    assert found, "the README no longer says how many tests scripts/test_vllm_cpu.sh ran"
    assert int(found.group(1)) == _tests_in(ROOT / "tests/inference/test_vllm_cpu.py")
