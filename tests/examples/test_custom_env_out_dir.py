"""`examples/custom_env/train.py` without `--resume` in an `--out-dir` that holds an earlier
run's checkpoints is refused before the model loads, as `ludic train` refuses it: it used to
train a new run over the old one, overwriting its low steps and leaving its newer ones to win a
later `--resume`. (And `--eval-k 1` reports pass@1 as the success rate; it was a KeyError.)"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow
def test_a_second_run_without_resume_is_refused_and_leaves_the_first_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES / "custom_env"))  # as `python train.py` does
    spec = importlib.util.spec_from_file_location(
        "custom_env_train", EXAMPLES / "custom_env" / "train.py"
    )
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "custom_env_train", example)
    spec.loader.exec_module(example)
    small = dict(problems_per_step=1, group_size=2, max_turns=2, eval_problems=1, eval_k=2)
    first = example.LightsConfig(steps=1, out_dir=tmp_path, progress=False, **small)
    metrics = example.main(dataclasses.replace(first, eval_k=1))  # was a KeyError: 'pass@1'
    assert metrics["pass@1"] == metrics["success_rate"]  # one episode per pattern
    step1 = tmp_path / "checkpoints" / "step_00000001"
    saved = (step1 / "state.json").read_bytes(), (tmp_path / "metrics.jsonl").read_text()

    again = example.LightsConfig(
        steps=1, algorithm="gigpo", out_dir=tmp_path, progress=False, **small
    )
    with pytest.raises(FileExistsError, match="holds an earlier run's checkpoints") as refused:
        example.main(again)
    assert "--resume" in str(refused.value) and "--out-dir" in str(refused.value)
    assert ((step1 / "state.json").read_bytes(), (tmp_path / "metrics.jsonl").read_text()) == saved
