"""`resolve_decoder` on a tokenizer directory that is not there: the error says so (not that
the directory "holds no tokenizer") and names the checkpoints that do exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from ludic.viz.tokens import resolve_decoder


def test_a_missing_checkpoint_directory_names_the_ones_that_exist(tmp_path: Path) -> None:
    checkpoints = tmp_path / "rl" / "checkpoints"
    (checkpoints / "step_00000001" / "model").mkdir(parents=True)
    missing = checkpoints / "step_00000003" / "model"
    with pytest.raises(FileNotFoundError, match=r"does not exist; checkpoints in .*step_00000001"):
        resolve_decoder(str(missing), [])
    with pytest.raises(FileNotFoundError, match="does not exist; give a model or tokenizer"):
        resolve_decoder(tmp_path / "nope", [])


def test_a_directory_without_a_tokenizer_still_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="holds no tokenizer"):
        resolve_decoder(str(tmp_path), [])
