"""bench/train_step.py counts the generation's model forwards as model compute: the embedded
engine runs them through its lean forward, which reads the served model's parameters without
calling the model, so the forward hooks the bench timed them with never fired and the report
gave 0 s of generation compute (every second of generation counted as library overhead)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def train_step(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # as `python bench/train_step.py` runs it
    monkeypatch.delitem(sys.modules, "train_step", raising=False)
    from ludic.inference.embedded.lean_forward import LeanForward

    monkeypatch.setattr(LeanForward, "__call__", LeanForward.__call__)  # undone after the test
    return importlib.import_module("train_step")


def test_a_step_times_every_generation_forward_as_model_compute(train_step: ModuleType) -> None:
    watch = train_step.Stopwatch()
    trainer, engine, _ = train_step.build(watch)
    forwards: list[float] = []
    add = watch.add

    def counted(name: str, seconds: float) -> None:
        if name == "generation_model":
            forwards.append(seconds)
        add(name, seconds)

    watch.add = counted
    try:
        train_step.measure(trainer, watch)  # warm-up, as the bench's main does
        forwards.clear()
        step = train_step.measure(trainer, watch)
    finally:
        engine.close()
    # every completion token is one decode step, each one forward of the served model
    assert len(forwards) >= train_step.COMPLETION_TOKENS, (len(forwards), step)
    assert step["generation_model_s"] == sum(forwards) > 0, step
