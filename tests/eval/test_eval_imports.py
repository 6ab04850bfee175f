"""Importing evaluation and the viewer stays light: no torch, transformers or matplotlib until a
command that needs them runs, and nothing from the training stack."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import ludic.eval, ludic.eval.command, ludic.viz
heavy = sorted(m for m in ("torch", "transformers", "matplotlib") if m in sys.modules)
training = sorted(m for m in sys.modules if m.startswith("ludic.training"))
print(heavy, training)
"""


def test_eval_and_viz_import_without_heavy_or_training_modules() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[] []"
