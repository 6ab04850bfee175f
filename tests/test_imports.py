"""Importing the rollout side of Ludic must not pull in torch or vLLM (a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys

CHECK = (
    "import sys, ludic, ludic.envs, ludic.agents, ludic.interaction, ludic.context, "
    "ludic.parsers, ludic.types, ludic.inference, ludic.sandbox, ludic.rollouts, ludic.eval; "
    "heavy = sorted(m for m in ('torch', 'vllm') if m in sys.modules); "
    "assert not heavy, f'importing ludic pulled in {heavy}'"
)


def test_core_imports_are_light() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
