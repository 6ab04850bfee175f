"""`ludic plot DIR` on a run folder names the metrics.jsonl inside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ludic.viz.plots import read_metrics


def test_a_run_folder_names_the_metrics_file_inside_it(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    with pytest.raises(ValueError) as caught:
        read_metrics(tmp_path)
    inside = tmp_path / "metrics.jsonl"
    assert str(caught.value) == (
        f"{tmp_path} is a folder, not a metrics file; its metrics are in {inside}: "
        f"`ludic plot {inside}`"
    )
