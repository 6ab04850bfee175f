"""The training examples (`tictactoe/selfplay.py`, `tictactoe/train.py`, `math_qa/train.py`,
`delegation/train.py`, `awr_tictactoe.py`) refuse, before the model loads, an `--out-dir`
holding an earlier run's checkpoints, as `ludic train` and `examples/custom_env/train.py` do: a
second run there overwrote the first one's checkpoints of the same steps and left its later
ones to be taken for the newest model. `awr_tictactoe.py` checks the runs of the call (its
seeds' start, sft and awr), leaving other seeds' and methods' runs in the same dir alone."""

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


DELEGATION: dict[str, Any] = {"sft_steps": 1, "rl_steps": 1}
AWR: dict[str, Any] = {"steps": 1, "seeds": 2}  # seeds 0 and 1
AWR_SELF: dict[str, Any] = {**AWR, "self_episodes": 1, "methods": ("awr",)}


def no_model(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("the model loaded before the out-dir was checked")


@pytest.mark.parametrize(
    ("relative", "config", "loader", "stage", "kwargs"),
    [
        ("tictactoe/selfplay.py", "SelfPlayConfig", "load_policy", "", {"steps": 1}),
        ("tictactoe/train.py", "TrainConfig", "load_policy", "", {"steps": 1}),
        ("math_qa/train.py", "MathConfig", "load_policy", "", {"steps": 1}),
        ("delegation/train.py", "DelegationConfig", "build_tiny_model", "sft", DELEGATION),
        ("delegation/train.py", "DelegationConfig", "build_tiny_model", "rl", DELEGATION),
        ("awr_tictactoe.py", "AWRConfig", "build_tiny_model", "seed_0/sft", AWR),
        ("awr_tictactoe.py", "AWRConfig", "build_tiny_model", "seed_0/awr", AWR),
        ("awr_tictactoe.py", "AWRConfig", "build_tiny_model", "seed_1/awr", AWR),
        ("awr_tictactoe.py", "AWRConfig", "build_tiny_model", "seed_0/start", AWR_SELF),
    ],
)
def test_an_out_dir_with_an_earlier_runs_checkpoints_is_refused(
    relative: str,
    config: str,
    loader: str,
    stage: str,
    kwargs: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    example = load(relative, monkeypatch)
    monkeypatch.setattr(example, loader, no_model)
    state = earlier_run(tmp_path / stage / "checkpoints")
    cfg = getattr(example, config)(**kwargs, out_dir=tmp_path)
    with pytest.raises(FileExistsError, match="holds an earlier run's checkpoints") as refused:
        example.main(cfg)
    assert "--out-dir" in str(refused.value)
    assert state.read_text() == '{"step": 40}'
    # nothing written before the refusal (delegation's demos, awr's untrained models)
    assert not (tmp_path / "demos.jsonl").exists()
    assert not list(tmp_path.glob("seed_*/init"))


@pytest.mark.parametrize(
    ("stage", "kwargs"),
    [
        ("seed_2/sft", AWR),  # another seed's run (see --first-seed)
        ("seed_0/sft", {**AWR, "methods": ("awr",)}),  # another method's run (see --methods)
        ("seed_0/start", AWR),  # no stage-1 SFT without --self-episodes
    ],
)
def test_awr_leaves_alone_the_runs_this_call_does_not_train(
    stage: str, kwargs: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = load("awr_tictactoe.py", monkeypatch)
    earlier_run(tmp_path / stage / "checkpoints")
    example.check_out_dir(example.AWRConfig(**kwargs, out_dir=tmp_path))
