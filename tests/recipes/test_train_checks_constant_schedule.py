"""`ludic train --min-lr-ratio X` or `--schedule-steps N` with the constant LR schedule (the
default) is refused before the model loads, naming the flag and the fix: the constant schedule
never reads them, so the run would train at --lr throughout. The library only warns
(`UnreadOptionWarning`) so that a sweep can pass them to every arm; a typed flag that does
nothing is surely a mistake."""

from __future__ import annotations

from pathlib import Path

import pytest
import tyro

from ludic.recipes.configs import TrainConfig
from ludic.recipes.train import train_command
from ludic.recipes.train_checks import check_constant_schedule_flags, check_counts


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--min-lr-ratio", "0.1"], r"^--min-lr-ratio 0\.1 only shapes a decaying LR"),
        (["--schedule-steps", "40"], r"^--schedule-steps 40 only shapes a decaying LR"),
        (
            ["--min-lr-ratio", "0.1", "--schedule-steps", "40"],
            r"^--min-lr-ratio 0\.1 and --schedule-steps 40 .* or drop them$",
        ),
    ],
)
def test_a_decay_flag_with_the_constant_schedule_is_refused_before_anything_runs(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    cfg = tyro.cli(TrainConfig, args=["--out-dir", str(tmp_path), *flags])
    with pytest.raises(ValueError, match=message):
        check_counts(cfg)  # the up-front checks, run before the model loads
    with pytest.raises(ValueError, match=message) as refused:
        train_command(cfg)
    assert "pass --lr-schedule cosine or linear" in str(refused.value)
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_a_decaying_schedule_reads_them(schedule: str) -> None:
    args = ["--lr-schedule", schedule, "--min-lr-ratio", "0.1", "--schedule-steps", "40"]
    check_constant_schedule_flags(tyro.cli(TrainConfig, args=args))


def test_the_constant_schedule_at_its_defaults_is_taken() -> None:
    check_constant_schedule_flags(tyro.cli(TrainConfig, args=["--warmup-steps", "3"]))
