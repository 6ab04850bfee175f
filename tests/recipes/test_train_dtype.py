"""`ludic train --dtype bfloat16`: the training forward runs under bfloat16 autocast (the usual
choice on a GPU; the GPU run itself: tests/recipes/test_train_cuda.py). The engine samples in
float32, so the recomputed logprobs differ from the behaviour ones by bfloat16 rounding: that
difference is what shows the flag reached the Trainer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.recipes.configs import TrainConfig
from ludic.recipes.train import train_command


def first_step(tmp_path: Path, dtype: str) -> dict[str, float]:
    out = tmp_path / dtype
    cfg = TrainConfig(
        dtype=dtype,  # type: ignore[arg-type]
        steps=1,
        problems_per_step=1,
        group_size=2,
        max_tokens=4,
        max_steps=2,
        out_dir=out,
        progress=False,
    )
    assert train_command(cfg).steps == 1
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[0])


def test_bfloat16_autocast_reaches_the_trainer(tmp_path: Path) -> None:
    float32, bfloat16 = first_step(tmp_path, "float32"), first_step(tmp_path, "bfloat16")
    assert float32["loss/mismatch/abs_log_ratio_mean"] < 1e-4  # same arithmetic: float noise
    assert 1e-4 < bfloat16["loss/mismatch/abs_log_ratio_mean"] < 0.1  # bfloat16 rounding
    assert bfloat16["loss/mismatch/tokens"] == pytest.approx(1.0)


def test_a_dtype_the_trainer_does_not_offer_is_refused_naming_the_flag(tmp_path: Path) -> None:
    from ludic import cli

    with pytest.raises(SystemExit):
        cli.main(["train", "--dtype", "float16", "--out-dir", str(tmp_path), "--no-progress"])


def test_batch_invariant_with_bfloat16_autocast_is_refused_before_the_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Autocast moves the trainer's logprobs by ~1e-3, so the bit-for-bit recomputation that
    --batch-invariant promises cannot hold: refused, naming both flags."""
    import ludic.recipes.train as train_module

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model loaded before the flags were checked")

    monkeypatch.setattr(train_module, "load_policy", no_model)
    cfg = TrainConfig(dtype="bfloat16", batch_invariant=True, out_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"--batch-invariant.*--dtype bfloat16"):
        train_command(cfg)
