"""`examples/sft_from_jsonl.py` refuses, before the model loads, an `--out-dir` holding an
earlier run's checkpoints (a second run there silently overwrote the first one's checkpoints
and metrics) and a `--data` that is not a file (it was a traceback from deep inside the batch
source, after the model had loaded)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_sft_example(monkeypatch: pytest.MonkeyPatch) -> object:
    spec = importlib.util.spec_from_file_location(
        "example_sft_from_jsonl_out_dir", EXAMPLES / "sft_from_jsonl.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses resolve annotations
    spec.loader.exec_module(module)
    return module


def test_an_out_dir_with_an_earlier_runs_checkpoints_is_refused_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = load_sft_example(monkeypatch)
    data = tmp_path / "kept.jsonl"
    data.write_text("")
    out = tmp_path / "sft"
    step = out / "checkpoints" / "step_00000003"
    (step / "model").mkdir(parents=True)
    (step / "state.json").write_text('{"step": 3}')
    (step / "MANIFEST.json").write_text("{}")  # written last: a save that finished
    metrics = out / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 7.9}\n')

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model loaded before the out-dir was checked")

    monkeypatch.setattr(example, "load_policy", no_model)
    cfg = example.SFTConfig(data=data, steps=1, out_dir=out)  # type: ignore[attr-defined]
    with pytest.raises(FileExistsError, match="holds an earlier run's checkpoints") as refused:
        example.main(cfg)  # type: ignore[attr-defined]
    assert "--out-dir" in str(refused.value) and "--resume" not in str(refused.value)
    assert metrics.read_text() == '{"step": 1, "loss": 7.9}\n'


def test_data_that_is_not_a_file_is_refused_before_the_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = load_sft_example(monkeypatch)

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model loaded before --data was checked")

    monkeypatch.setattr(example, "load_policy", no_model)
    cfg = example.SFTConfig(  # type: ignore[attr-defined]
        data=tmp_path / "nope.jsonl", steps=1, out_dir=tmp_path / "sft"
    )
    with pytest.raises(FileNotFoundError, match=r"--data .*nope\.jsonl is not a file"):
        example.main(cfg)  # type: ignore[attr-defined]
