"""A first SIGINT/SIGTERM during a checkpoint save is acted on once the save completes; a second
one cuts the save short, rolled back (end to end through `ludic train`:
tests/recipes/test_train_sigterm_during_save.py)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest
from training_fakes import tiny_llama

from ludic.training import CheckpointConfig, CheckpointManager
from ludic.training.checkpoint_manifest import MANIFEST


class Stop(Exception):
    """What the test's handler raises, as the `ludic` command's raises KeyboardInterrupt."""


class SignalledManager(CheckpointManager):
    """Sends `signals` to this process while the save writes its manifest."""

    signals: tuple[int, ...] = ()

    def _write_manifest(self, tmp: Path, step: int) -> None:
        for signum in self.signals:
            signal.raise_signal(signum)
        super()._write_manifest(tmp, step)


class Recorder:
    """A handler like the `ludic` command's for SIGINT and SIGTERM: records (the signal, whether
    checkpoint step 2 under `root` was complete then) and raises."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool]] = []
        self.root: Path | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        done = self.root is not None and (self.root / "step_00000002" / MANIFEST).is_file()
        self.calls.append((signum, done))
        raise Stop(signum)


@pytest.fixture
def received() -> Iterator[Recorder]:
    recorder = Recorder()
    previous = {sig: signal.signal(sig, recorder) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield recorder
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _manager(tmp_path: Path, received: Recorder) -> SignalledManager:
    manager = SignalledManager(CheckpointConfig(dir=str(tmp_path / "ckpt")))
    received.root = manager.root
    return manager


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_first_signal_during_a_save_is_acted_on_after_it(
    tmp_path: Path, received: Recorder, signum: int
) -> None:
    manager = _manager(tmp_path, received)
    first = manager.save(step=1, model=tiny_llama(seed=1))
    manager.signals = (signum,)
    with pytest.raises(Stop):
        manager.save(step=2, model=tiny_llama(seed=2))
    assert received.calls == [(signum, True)]  # once, with step 2 complete
    assert manager.list() == [first, manager.path_for(2)]
    manager.verify(manager.path_for(2), deep=True)
    assert manager.load().step == 2
    assert not list(manager.root.glob(".tmp-*"))
    with pytest.raises(Stop):  # the handler is back: outside a save a signal stops at once
        signal.raise_signal(signal.SIGTERM)
    assert received.calls[-1] == (signal.SIGTERM, True)


def test_a_second_signal_during_a_save_stops_it_at_once_and_rolls_it_back(
    tmp_path: Path, received: Recorder
) -> None:
    manager = _manager(tmp_path, received)
    first = manager.save(step=1, model=tiny_llama(seed=1))
    manager.signals = (signal.SIGTERM, signal.SIGINT)
    with pytest.raises(Stop):
        manager.save(step=2, model=tiny_llama(seed=2))
    assert received.calls == [(signal.SIGTERM, False)]  # the first signal's, before step 2 existed
    assert manager.list() == [first] and manager.latest() == first
    assert not list(manager.root.glob(".tmp-*"))


def test_without_a_signal_nothing_changes(tmp_path: Path, received: Recorder) -> None:
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    manager = _manager(tmp_path, received)
    manager.save(step=1, model=tiny_llama(seed=1))
    assert received.calls == []
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers


def test_a_save_off_the_main_thread_leaves_signals_alone(
    tmp_path: Path, received: Recorder
) -> None:
    manager = _manager(tmp_path, received)
    saved: list[Path] = []
    errors: list[BaseException] = []

    def save() -> None:
        try:
            saved.append(manager.save(step=1, model=tiny_llama(seed=1)))
        except BaseException as e:  # signal.signal raises ValueError off the main thread
            errors.append(e)

    thread = threading.Thread(target=save)
    thread.start()
    thread.join()
    assert errors == [] and saved == [manager.path_for(1)]
