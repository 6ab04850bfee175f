"""A `ludic train` refused before the model loads (an --out-dir holding an earlier run's
checkpoints, another live run in it) said what the run would do first ("parser: ...", the
context line), then refused: two lines about a run that never starts above the one that
matters. The refusal now comes before them; a run that starts still prints them."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from ludic.recipes.configs import TrainConfig
from ludic.recipes.train import train_command


def test_an_out_dir_holding_checkpoints_is_refused_before_the_run_is_described(
    tmp_path: Path,
) -> None:
    step = tmp_path / "checkpoints" / "step_00000001"
    (step / "model").mkdir(parents=True)
    (step / "MANIFEST.json").write_text("{}")
    console = Console(record=True, width=200)
    with pytest.raises(FileExistsError, match="holds an earlier run's checkpoints"):
        train_command(TrainConfig(out_dir=tmp_path, env="tictactoe"), console=console)
    printed = console.export_text()
    assert "parser:" not in printed and "context:" not in printed, printed


def test_a_bad_group_size_is_refused_before_the_run_is_described(tmp_path: Path) -> None:
    console = Console(record=True, width=200)
    with pytest.raises(ValueError, match="group"):
        train_command(
            TrainConfig(out_dir=tmp_path, env="tictactoe", algorithm="grpo", group_size=1),
            console=console,
        )
    assert "parser:" not in console.export_text(), console.export_text()
