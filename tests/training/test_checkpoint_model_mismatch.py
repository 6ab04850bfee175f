"""`ludic train --resume` with a `--model` of another shape names the checkpoint, the first
differing tensor and the fix, instead of torch's "Error(s) in loading state_dict" (fails if the
raw torch error reaches the user)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ludic.cli import main as ludic_main
from ludic.models import TinyModelSpec, tiny_model_dir
from ludic.training.checkpoint import CheckpointModelMismatchError

FLAGS = ["--problems-per-step", "1", "--group-size", "2", "--max-tokens", "6", "--max-steps", "2"]
FLAGS += ["--no-progress"]


@pytest.mark.slow
def test_resume_with_a_model_of_another_shape_names_the_tensor_and_the_fix(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    ludic_main(["train", "--out-dir", str(out), "--steps", "1", *FLAGS])
    narrow = tiny_model_dir(spec=TinyModelSpec(hidden_size=128, intermediate_size=352))
    args = ["train", "--out-dir", str(out), "--steps", "2", "--resume", "--model", str(narrow)]
    with pytest.raises(CheckpointModelMismatchError) as e:
        ludic_main([*args, *FLAGS])
    message = str(e.value)
    assert str(out / "checkpoints" / "step_00000001") in message
    shapes = r"model\.embed_tokens\.weight is \[(\d+), 256\] in the checkpoint but \[\1, 128\]"
    assert re.search(shapes, message), message
    assert "`ludic train --model`" in message and str(narrow) in message
    assert "Error(s) in loading state_dict" not in message
