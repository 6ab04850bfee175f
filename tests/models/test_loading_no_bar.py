"""`load_model` prints no "Loading weights" bar (it showed under `ludic eval --no-progress` and
in every log) and leaves transformers' progress bars as it found them."""

from __future__ import annotations

import pytest
from transformers.utils import logging as hf_logging

from ludic.models import load_model, tiny_model_dir


@pytest.mark.parametrize("bars_before", [True, False])
def test_load_model_shows_no_bar(
    bars_before: bool, capfd: pytest.CaptureFixture[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    directory = tiny_model_dir(cache_dir=tmp_path_factory.getbasetemp() / "tiny")
    (hf_logging.enable_progress_bar if bars_before else hf_logging.disable_progress_bar)()
    try:
        capfd.readouterr()
        load_model(directory)
        out, err = capfd.readouterr()
        assert "Loading weights" not in out + err, err
        assert hf_logging.is_progress_bar_enabled() is bars_before
    finally:
        hf_logging.enable_progress_bar()
