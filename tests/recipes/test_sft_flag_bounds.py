"""`ludic sft --lr 0` or `--micro-batch-tokens 0` were refused only after the model had loaded
and `--out-dir` had been created, naming the trainer's fields (`lr must be > 0`,
`micro_batch_tokens must be > 0`), not the flags, where its other counts are refused up front.
They are now refused with those, naming the flag, before anything is created."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.recipes.configs import SFTConfig
from ludic.recipes.sft import sft_command


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"lr": 0.0}, "--lr must be a finite number > 0, got 0.0 (the peak, e.g. 1e-3)"),
        ({"lr": float("inf")}, "--lr must be a finite number > 0, got inf (the peak, e.g. 1e-3)"),
        (
            {"micro_batch_tokens": 0},
            "--micro-batch-tokens is 0: a micro-batch of 0 tokens holds no sample",
        ),
    ],
)
def test_a_flag_out_of_bounds_is_refused_before_the_out_dir_is_made(
    flags: dict[str, float], message: str, tmp_path: Path
) -> None:
    data = tmp_path / "kept.jsonl"
    data.write_text(json.dumps({"id": "r", "steps": []}) + "\n")
    out = tmp_path / "run"
    with pytest.raises(ValueError) as refused:
        sft_command(SFTConfig(data=data, out_dir=out, steps=1, **flags))  # type: ignore[arg-type]
    assert str(refused.value).startswith(message)
    assert not out.exists()
