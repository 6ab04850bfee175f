"""The closing reward line of examples/custom_env/train.py and examples/tictactoe/train.py: a
step whose every episode failed logs batch/mean_reward 0.0, a reward no episode earned, so the
line quotes the first and last step with a successful episode (`closing_rewards`, as `ludic
train` does), or says that no step had one. Both used to quote the failed step's 0.0."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FAILED = {"batch/mean_reward": 0.0, "batch/num_rollouts": 4.0, "batch/num_failed": 4.0}


def ran(reward: float) -> dict[str, float]:
    return {"batch/mean_reward": reward, "batch/num_rollouts": 4.0, "batch/num_failed": 1.0}


class _Stop(Exception):
    """Stops custom_env's main after its closing reward line, before it evaluates."""


class _Inference:
    """Stands in for the examples' InferenceArgs: no engine is started."""

    client = None
    publisher = None

    def make(self, *args: Any, **kwargs: Any) -> _Inference:
        return self

    async def aclose(self) -> None:
        pass


class _Trainer:
    """Stands in for make_trainer's Trainer: `train` returns the history it was given."""

    step = 0

    def __init__(self, history: list[dict[str, float]]) -> None:
        self.history = history

    async def train(self, steps: int, progress: bool = True) -> list[dict[str, float]]:
        return [dict(m) for m in self.history]


def load(relative: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    path = EXAMPLES / relative
    monkeypatch.syspath_prepend(str(path.parent))  # custom_env imports lights.py beside it
    name = "failed_step_rewards_" + relative.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses resolve annotations here
    spec.loader.exec_module(module)
    return module


def closing_line(
    relative: str,
    history: list[dict[str, float]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> str:
    """What the example's main prints about rewards after its training logged `history` and
    saved its final checkpoint at step len(history) (no model is built or trained)."""
    example = load(relative, monkeypatch)
    checkpoint = tmp_path / "checkpoints" / f"step_{len(history):08d}"

    def evaluate(*args: Any) -> Any:
        raise _Stop

    monkeypatch.setattr(example, "load_policy", lambda *args, **kwargs: (None, None))
    monkeypatch.setattr(example, "make_trainer", lambda *args, **kwargs: _Trainer(history))
    monkeypatch.setattr(example, "finish", lambda trainer: checkpoint)
    monkeypatch.setattr(example, "evaluate", evaluate, raising=False)
    monkeypatch.setattr(example, "plot_curve", lambda *args: tmp_path / "reward_curve.png")
    name = "LightsConfig" if relative.startswith("custom_env") else "TrainConfig"
    cfg = getattr(example, name)(out_dir=tmp_path, inference=_Inference())
    with contextlib.suppress(_Stop):  # custom_env's main stops before it evaluates
        example.main(cfg)
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "mean episode reward" in x]
    return line


@pytest.mark.parametrize("relative", ["custom_env/train.py", "tictactoe/train.py"])
def test_a_failed_first_step_is_not_quoted_as_reward_0(
    relative: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = closing_line(relative, [FAILED, ran(-1.0), ran(-0.5)], tmp_path, monkeypatch, capsys)
    assert line.endswith(
        "mean episode reward -1.000 (step 2) -> -0.500 (step 3), the first and last step with "
        "a successful episode (1 step of this launch had none)"
    ), line
    assert "+0.000" not in line


@pytest.mark.parametrize("relative", ["custom_env/train.py", "tictactoe/train.py"])
def test_a_run_whose_every_step_failed_has_no_reward(
    relative: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = closing_line(relative, [FAILED, FAILED], tmp_path, monkeypatch, capsys)
    assert line.endswith("mean episode reward unknown: no step had a successful episode"), line


@pytest.mark.parametrize("relative", ["custom_env/train.py", "tictactoe/train.py"])
def test_rewarded_steps_are_quoted_with_their_step_numbers(
    relative: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = closing_line(relative, [ran(-1.0), ran(0.0)], tmp_path, monkeypatch, capsys)
    assert line.endswith("mean episode reward -1.000 (step 1) -> +0.000 (step 2)"), line
