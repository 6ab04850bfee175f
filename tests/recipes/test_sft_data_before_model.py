"""`ludic sft` reads its --data before the model loads (without --retokenize, which needs the
model's tokenizer), so a damaged line is refused naming the file and line in seconds, not after
a large model spent minutes loading."""

from __future__ import annotations

from pathlib import Path

import pytest

import ludic.recipes.sft as sft
from ludic.recipes.configs import SFTConfig
from ludic.rollouts import write_rollouts_jsonl
from ludic.types import Rollout


def _no_model(*args: object, **kwargs: object) -> object:
    raise AssertionError("the model loaded before the data was read")


def test_a_damaged_line_is_refused_before_the_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data.jsonl"
    write_rollouts_jsonl([Rollout(id="a")], data)
    with data.open("a") as f:
        f.write("[1, 2, 3]\n")
    monkeypatch.setattr(sft, "load_policy", _no_model)
    cfg = SFTConfig(data=data, out_dir=tmp_path / "out", steps=1, progress=False)
    with pytest.raises(ValueError, match=f"{data}:2: not a JSON object"):
        sft.sft_command(cfg)
