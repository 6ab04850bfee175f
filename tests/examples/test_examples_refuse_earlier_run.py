"""The training examples (`tictactoe/selfplay.py`, `math_qa/train.py`, `delegation/train.py`)
refuse, before the model loads, an `--out-dir` holding an earlier run's checkpoints, as `ludic
train` and `examples/custom_env/train.py` do: a second run there overwrote the first one's
checkpoints of the same steps and left its later ones to be taken for the newest model."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(relative: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    name = "example_refuse_" + relative.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses resolve annotations
    spec.loader.exec_module(module)
    return module


def earlier_run(checkpoints: Path) -> Path:
    """A finished checkpoint (its manifest written last) and returns its state.json."""
    step = checkpoints / "step_00000040"
    (step / "model").mkdir(parents=True)
    (step / "state.json").write_text('{"step": 40}')
    (step / "MANIFEST.json").write_text("{}")
    return step / "state.json"


def no_model(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("the model loaded before the out-dir was checked")


@pytest.mark.parametrize(
    ("relative", "config", "loader", "stage"),
    [
        ("tictactoe/selfplay.py", "SelfPlayConfig", "load_policy", ""),
        ("math_qa/train.py", "MathConfig", "load_policy", ""),
        ("delegation/train.py", "DelegationConfig", "build_tiny_model", "sft"),
        ("delegation/train.py", "DelegationConfig", "build_tiny_model", "rl"),
    ],
)
def test_an_out_dir_with_an_earlier_runs_checkpoints_is_refused(
    relative: str,
    config: str,
    loader: str,
    stage: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    example = load(relative, monkeypatch)
    monkeypatch.setattr(example, loader, no_model)
    state = earlier_run(tmp_path / stage / "checkpoints")
    cfg = getattr(example, config)(steps=1, out_dir=tmp_path) if stage == "" else None
    if cfg is None:
        cfg = getattr(example, config)(sft_steps=1, rl_steps=1, out_dir=tmp_path)
    with pytest.raises(FileExistsError, match="holds an earlier run's checkpoints") as refused:
        example.main(cfg)
    assert "--out-dir" in str(refused.value)
    assert state.read_text() == '{"step": 40}'
    if stage:
        assert not (tmp_path / "demos.jsonl").exists()  # nothing written before the refusal
