"""`ludic eval` refuses a count below 1 (--num-problems, --samples-per-problem, --max-steps,
--concurrency) or an --episode-timeout-s <= 0 among its flag checks, naming the flag, with
nothing printed: --num-problems 0 was refused after the context and engine lines, --concurrency
0 after the model loaded (as "RolloutEngine.concurrency"), --max-steps 0 by each episode's
protocol (every episode failed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from ludic.eval.command import EvalConfig, run_eval_command


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_problems", 0, "--num-problems must be >= 1, got 0"),
        ("samples_per_problem", 0, "--samples-per-problem must be >= 1, got 0"),
        ("max_steps", 0, "--max-steps must be >= 1, got 0"),
        ("concurrency", 0, "--concurrency must be >= 1, got 0"),
        ("episode_timeout_s", 0.0, "--episode-timeout-s must be > 0 seconds"),
    ],
)
def test_a_bad_count_is_refused_before_anything(
    tmp_path: Path, field: str, value: float, message: str
) -> None:
    console = Console(record=True, width=200)
    cfg = EvalConfig(env="tictactoe", out_dir=tmp_path / "eval", progress=False, **{field: value})
    with pytest.raises(ValueError) as caught:
        run_eval_command(cfg, console=console)
    assert str(caught.value).startswith(message)
    assert console.export_text() == ""
    assert not (tmp_path / "eval").exists()
