"""`ludic learner --model PATH` with nothing at PATH is refused naming the flag before torch or
transformers is imported (the import took ~30 s of the refusal on a loaded box), ahead of the
Redis check too. A missing step folder is still left to the check that imports torch: a re-save
killed between its renames leaves it aside, and that check renames it back."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_fakes import free_port, ludic_without_torch

from ludic.pipeline.config import LearnerConfig
from ludic.pipeline.flag_checks import check_learner_model_path

pytestmark = pytest.mark.timeout(120)


def test_a_missing_model_is_refused_before_torch_is_imported(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: the model is named first
    missing = tmp_path / "nonexistent"
    out = ["--out-dir", str(tmp_path / "run")]
    result = ludic_without_torch("learner", "--redis-url", url, "--model", str(missing), *out)
    assert result.returncode == 1, result.stderr
    assert (
        f"ludic learner: error: no model directory at {missing} (--model): check the path"
        in result.stderr
    )
    assert "imported before the Redis check" not in result.stderr
    assert "unreachable" not in result.stderr


@pytest.mark.parametrize("where", ["checkpoints/step_00000004", "checkpoints/step_00000004/model"])
def test_a_missing_step_folder_is_left_to_the_check_that_restores_it(
    tmp_path: Path, where: str
) -> None:
    check_learner_model_path(LearnerConfig(model=tmp_path / where))  # no refusal here
    check_learner_model_path(LearnerConfig(model=None))  # the tiny model
    with pytest.raises(FileNotFoundError, match=r"^no model directory at .* \(--model\)"):
        check_learner_model_path(LearnerConfig(model=tmp_path / "checkpoints"))
