"""Every script under bench/ answers `--help` (exit 0, its usage) with a description that says
what it measures: the whole first paragraph of its docstring, not a line cut mid-sentence
(weight_sync.py said "... vs a raw `torch.distributed` broadcast of the") and never none
(lend_threads_probe.py had no description)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))  # _*: helpers
# Scripts whose description is not their docstring's first paragraph: tyro shows the config
# dataclass's docstring; the TRL worker (run by rl_step.py in the TRL venv) names its caller.
OWN_DESCRIPTION = {
    "gigpo_vs_grpo.py": "GiGPO vs GRPO on the corridor task.",
    "trl_side.py": "the TRL worker of bench/rl_step.py",
}


def _first_paragraph(script: str) -> str:
    doc = ast.get_docstring(ast.parse((BENCH / script).read_text()))
    assert doc, f"bench/{script} has no module docstring"
    return " ".join(doc.split("\n\n")[0].split())


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_help_describes_the_bench(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--help"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
    # argparse and tyro rewrap and frame the text: compare words only
    words = " ".join(done.stdout.replace("│", " ").split())
    expected = OWN_DESCRIPTION.get(script) or _first_paragraph(script)
    assert expected in words, f"bench/{script} --help lacks {expected!r}:\n{done.stdout}"
