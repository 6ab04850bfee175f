"""`ludic train --lr 0`, `--checkpoint-every 0` or `--micro-batch-tokens 0` were refused only
after the model had loaded and `--out-dir` had been created, naming the trainer's fields
(`lr must be > 0`, `every_n_steps must be >= 1 or None`, `micro_batch_tokens must be > 0`),
not the flags. They are now refused among the flag checks, naming the flag, before anything
is created."""

from __future__ import annotations

from pathlib import Path

import pytest

from ludic.recipes.configs import TrainConfig
from ludic.recipes.train import train_command
from ludic.recipes.train_checks import check_counts


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"lr": 0.0}, "--lr must be a finite number > 0, got 0.0"),
        ({"lr": float("nan")}, "--lr must be a finite number > 0, got nan"),
        ({"checkpoint_every": 0}, "--checkpoint-every must be >= 1, got 0"),
        (
            {"micro_batch_tokens": 0},
            "--micro-batch-tokens is 0: a micro-batch of 0 tokens holds no sample",
        ),
    ],
)
def test_a_flag_out_of_bounds_is_refused_before_the_out_dir_is_made(
    flags: dict[str, float], message: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with pytest.raises(ValueError) as refused:
        train_command(TrainConfig(out_dir=out, steps=1, **flags))  # type: ignore[arg-type]
    assert str(refused.value).startswith(message)
    assert not out.exists()


def test_none_keeps_its_meaning() -> None:
    check_counts(TrainConfig(checkpoint_every=None, micro_batch_tokens=None))  # not refused
