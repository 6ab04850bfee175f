"""`examples/custom_env/train.py --resume --steps N` where the newest checkpoint is past step N
trains nothing and evaluates that checkpoint, as its "nothing to train" line says: it used to
print that line and then crash with `num_steps must be an int >= 0, got -1`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow
def test_resume_with_fewer_steps_than_the_checkpoint_evaluates_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES / "custom_env"))  # as `python train.py` does
    spec = importlib.util.spec_from_file_location(
        "custom_env_train_past", EXAMPLES / "custom_env" / "train.py"
    )
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "custom_env_train_past", example)
    spec.loader.exec_module(example)
    small = dict(problems_per_step=1, group_size=2, max_turns=2, eval_problems=1, eval_k=2)
    example.main(example.LightsConfig(steps=2, out_dir=tmp_path, progress=False, **small))
    saved = (tmp_path / "metrics.jsonl").read_text()

    metrics = example.main(
        example.LightsConfig(steps=1, resume=True, out_dir=tmp_path, progress=False, **small)
    )
    assert "pass@1" in metrics
    printed = capsys.readouterr().out
    assert "nothing to train: the checkpoint is at step 2 and --steps is 1" in printed
    assert "step_00000002" in printed  # the checkpoint evaluated is the newest one
    assert (tmp_path / "metrics.jsonl").read_text() == saved  # no step trained
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir())[-1] == "step_00000002"
