"""`ludic train --keep-checkpoints K`, as `ludic sft` has it: after each save only the newest K
complete checkpoints stay (the default keeps two), a bare --resume continues from the newest
and prunes on, and a K below 1 is refused before the model loads."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import pytest
import tyro
from rich.console import Console

from ludic.recipes.configs import RESUME_LATEST, TrainConfig
from ludic.recipes.train import train_command


def steps_kept(out_dir: Path) -> list[str]:
    return sorted(p.name for p in (out_dir / "checkpoints").iterdir() if p.name.startswith("step_"))


@pytest.mark.slow
def test_old_steps_are_pruned_and_a_resume_continues_from_the_newest(tmp_path: Path) -> None:
    cfg = TrainConfig(
        env="train_envs:SaidOEnv",
        steps=4,
        problems_per_step=1,
        group_size=2,
        max_tokens=4,
        checkpoint_every=1,
        keep_checkpoints=3,
        out_dir=tmp_path / "run",
        progress=False,
    )
    quiet = Console(file=io.StringIO())
    train_command(cfg, console=quiet)
    assert steps_kept(cfg.out_dir) == ["step_00000002", "step_00000003", "step_00000004"]
    resumed = train_command(replace(cfg, steps=5, resume=RESUME_LATEST), console=quiet)
    assert resumed.steps == 1 and resumed.checkpoint.name == "step_00000005"
    assert steps_kept(cfg.out_dir) == ["step_00000003", "step_00000004", "step_00000005"]


def test_the_flag_parses_as_sfts_does_and_zero_is_refused_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tyro.cli(TrainConfig, args=["--keep-checkpoints", "5"]).keep_checkpoints == 5
    assert tyro.cli(TrainConfig, args=["--keep-checkpoints", "None"]).keep_checkpoints is None
    assert TrainConfig().keep_checkpoints == 2  # make_trainer's two, as before the flag
    import ludic.recipes.train as train_module

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model loaded before the refusal")

    monkeypatch.setattr(train_module, "load_policy", no_load)
    with pytest.raises(ValueError, match=r"--keep-checkpoints must be >= 1, got 0"):
        train_command(
            TrainConfig(out_dir=tmp_path, keep_checkpoints=0), console=Console(file=io.StringIO())
        )
