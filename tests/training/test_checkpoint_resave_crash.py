"""Re-saving a step (the final save after a periodic save of the same step) that is killed
between its two renames loses nothing: the old `step_N`, moved aside first, is renamed back by
the next listing, so resume finds it. Killed after the second rename, the new one stays and the
aside goes. The writer really dies (SIGKILL in a subprocess), as a killed run would."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from training_fakes import tiny_llama

from ludic.models.loading import check_model_directory
from ludic.training import CheckpointConfig, CheckpointManager
from ludic.training.checkpoint import checkpoint_step, complete_checkpoints, has_checkpoints
from ludic.training.checkpoint_scratch import this_host, this_writer

# Saves step 1 (policy version 1), then re-saves it (version 2) and SIGKILLs itself at `when`:
# "between" the renames (the new directory about to be renamed in, the old one aside) or
# "after" them (the aside about to be deleted).
RESAVE_KILLED = textwrap.dedent(
    """
    import os, shutil, signal, sys
    sys.path.insert(0, sys.argv[3])
    from training_fakes import tiny_llama
    from ludic.training import CheckpointConfig, CheckpointManager

    manager = CheckpointManager(CheckpointConfig(dir=sys.argv[1]))
    manager.save(step=1, model=tiny_llama(seed=1), policy_version=1)
    replace, rmtree = os.replace, shutil.rmtree

    def die(path):
        print("aside:", path, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    def replace_then_die(src, dst):
        if sys.argv[2] == "between" and os.path.basename(src).startswith(".tmp-"):
            die(os.path.join(os.path.dirname(src), [n for n in os.listdir(os.path.dirname(src))
                                                    if n.startswith(".old-")][0]))
        replace(src, dst)

    def rmtree_then_die(path, *args, **kwargs):
        if sys.argv[2] == "after" and os.path.basename(path).startswith(".old-"):
            die(path)
        rmtree(path, *args, **kwargs)

    os.replace, shutil.rmtree = replace_then_die, rmtree_then_die
    manager.save(step=1, model=tiny_llama(seed=2), policy_version=2)
    print("not killed", flush=True)
    """
)


def _resave_killed(root: Path, when: str) -> Path:
    """Run the killed re-save; returns the aside directory it left."""
    run = subprocess.run(
        [sys.executable, "-c", RESAVE_KILLED, str(root), when, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == -9, run.stdout + run.stderr  # SIGKILL
    (line,) = [x for x in run.stdout.splitlines() if x.startswith("aside:")]
    aside = Path(line.removeprefix("aside: "))
    assert aside.is_dir()
    return aside


@pytest.fixture(scope="module")
def killed_between(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A checkpoint root as the kill between the renames left it, kept pristine: tests copy it."""
    root = tmp_path_factory.mktemp("between") / "ckpt"
    aside = _resave_killed(root, "between")
    assert not (root / "step_00000001").exists()  # the instant the old code lost the step
    return root, aside


def _copy(root: Path, tmp_path: Path) -> Path:
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(root, copy, symlinks=True)
    return copy


def test_resume_after_a_kill_between_the_renames_finds_the_old_step(
    killed_between: tuple[Path, Path], tmp_path: Path
) -> None:
    root = _copy(killed_between[0], tmp_path)
    manager = CheckpointManager(CheckpointConfig(dir=str(root)))  # start-up: restore, not delete
    loaded = manager.load()
    assert loaded.step == 1 and loaded.policy_version == 1
    assert sorted(p.name for p in root.iterdir()) == ["step_00000001"]


def test_listing_alone_recovers_the_step(killed_between: tuple[Path, Path], tmp_path: Path) -> None:
    root = _copy(killed_between[0], tmp_path)
    assert has_checkpoints(root)
    assert checkpoint_step(root) == 1
    assert complete_checkpoints(root) == [root / "step_00000001"]
    CheckpointManager(CheckpointConfig(dir=str(root))).verify(root / "step_00000001")


def test_loading_the_step_folder_by_name_recovers_it(
    killed_between: tuple[Path, Path], tmp_path: Path
) -> None:
    root = _copy(killed_between[0], tmp_path)
    assert check_model_directory(root / "step_00000001") == root / "step_00000001" / "model"


def test_a_kill_after_the_renames_keeps_the_new_step(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    aside = _resave_killed(root, "after")
    manager = CheckpointManager(CheckpointConfig(dir=str(root)))
    assert manager.load().policy_version == 2
    assert not aside.exists()
    assert sorted(p.name for p in root.iterdir()) == ["step_00000001"]


def test_the_aside_of_a_live_writer_is_left_alone(tmp_path: Path) -> None:
    """A re-save in progress (its writer alive) is mid-swap: its aside is not taken back."""
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path / "ckpt")))
    saved = manager.save(step=3, model=tiny_llama())
    me = this_writer()
    aside = saved.with_name(f".old-step_00000003-cccccccc-{me.pid}-{me.start}-{this_host()}")
    saved.rename(aside)
    assert complete_checkpoints(manager.root) == []
    CheckpointManager(CheckpointConfig(dir=str(manager.root)))
    assert aside.is_dir() and not saved.exists()
