"""`ludic quickstart --hidden-size / --num-layers` that cannot build the tiny model are refused
naming the flag as typed (not TinyModelSpec's field names), before the earlier run's outputs in
OUT_DIR are replaced: the refusal came after they were deleted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ludic.errors import is_refusal
from ludic.recipes.configs import QuickstartConfig
from ludic.recipes.quickstart import run_quickstart


@pytest.mark.parametrize(
    ("sizes", "refusal"),
    [
        ({"hidden_size": 30}, "--hidden-size must be a positive multiple of 8 (the tiny model's "),
        ({"hidden_size": 0}, "--hidden-size must be a positive multiple of 8"),
        ({"num_layers": 0}, "--num-layers must be >= 1, got 0"),
    ],
)
def test_a_size_that_builds_no_model_is_refused_naming_the_flag_and_keeps_the_earlier_run(
    tmp_path: Path, sizes: dict[str, int], refusal: str
) -> None:
    earlier = tmp_path / "rl" / "checkpoints" / "step_00000002"
    earlier.mkdir(parents=True)
    with pytest.raises(ValueError) as e:
        run_quickstart(QuickstartConfig(out_dir=tmp_path, progress=False, **sizes))  # type: ignore[arg-type]
    message = str(e.value)
    assert refusal in message and "TinyModelSpec" not in message, message
    assert is_refusal(e.value), message
    assert earlier.is_dir()


def test_the_command_names_the_flag_with_a_size_that_works(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "quickstart", "--hidden-size", "30"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode != 0
    assert "got 30: e.g. --hidden-size 32" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
