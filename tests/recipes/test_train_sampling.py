"""`ludic train --top-p`: parsed into the config, and a value out of range is refused before
the model loads, naming the flag. (That the rollouts are sampled under it and the trainer
recomputes under it: tests/training/test_on_policy_ratio.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

import ludic.recipes.train as train_recipe
from ludic import cli
from ludic.recipes.configs import TrainConfig, sampling_from_flags
from ludic.recipes.train import rollout_sampling


def test_rollout_sampling_takes_temperature_and_top_p() -> None:
    sampling = rollout_sampling(TrainConfig(temperature=0.7, top_p=0.9, max_tokens=12))
    assert (sampling.temperature, sampling.top_p, sampling.max_tokens) == (0.7, 0.9, 12)
    assert rollout_sampling(TrainConfig()).top_p == 1.0  # off by default


@pytest.mark.parametrize("top_p", ["0", "1.5"])
def test_a_top_p_out_of_range_fails_before_the_model_loads(
    top_p: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded before the flags were checked")

    monkeypatch.setattr(train_recipe, "load_policy", no_model)
    with pytest.raises(ValueError, match=r"^--top-p must be in \(0, 1\], got "):
        cli.main(["train", "--top-p", top_p, "--out-dir", str(tmp_path), "--no-progress"])


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        ((1.0, 1.0, 0), "--max-tokens must be in [1, 9223372036854775807], got 0"),
        ((-1.0, 1.0, 8), "--temperature must be a finite number >= 0 (0: greedy), got -1.0"),
    ],
)
def test_a_sampling_flag_out_of_range_is_named_as_typed(
    flags: tuple[float, float, int], refusal: str
) -> None:
    """The refusal names the flag, not SamplingConfig's field (`max_tokens must be ...` after a
    list of three flags read as if the user had typed a field name)."""
    with pytest.raises(ValueError) as refused:
        sampling_from_flags(*flags)
    assert str(refused.value) == refusal
