"""`ludic eval --credit gigpo` without --samples-per-problem >= 2 is refused among the flag
checks, with nothing printed and nothing resolved: it came after the context and engine lines
(and after the tiny model was built when --model was left out) and after the out-dir check."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from ludic.eval.command import EvalConfig, run_eval_command


def test_credit_gigpo_with_one_sample_is_refused_before_anything(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    out.mkdir()
    (out / "metrics.json").write_text('{"episodes": 3}\n')  # an earlier run's records
    console = Console(record=True, width=200)
    cfg = EvalConfig(env="tictactoe", credit="gigpo", out_dir=out, progress=False)
    with pytest.raises(ValueError, match=r"--credit gigpo .* --samples-per-problem 2 or more"):
        run_eval_command(cfg, console=console)
    assert console.export_text() == ""
