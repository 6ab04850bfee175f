"""A checkpoint save that the file system refuses (a full disk, a read-only one, a file-size
limit) raises `CheckpointSaveError`, a refusal naming the cause, the directory and the last
complete checkpoint, which stays intact and is what resume picks; the partial save is removed.
torch said "[enforce fail at inline_container.cc:672] . unexpected pos 1472 vs 1364" for a full
disk, and a read-only directory was a bare OSError traceback.

The full and read-only disks are a small tmpfs, mounted where the test may (root, with mount
allowed), else skipped; the file-size limit (`ulimit -f`, a real refused write) runs anywhere."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ludic.errors import is_refusal
from ludic.training import CheckpointConfig, CheckpointManager
from ludic.training.checkpoint_save_failure import (
    FULL_BELOW_BYTES,
    CheckpointSaveError,
    save_failed,
)

SAVE_PAST_LIMIT = textwrap.dedent(
    """
    import resource, signal, sys
    import torch
    from ludic.training import CheckpointConfig, CheckpointManager
    from ludic.training.checkpoint_save_failure import CheckpointSaveError

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    manager = CheckpointManager(CheckpointConfig(dir=sys.argv[1], keep_last=None))
    manager.save(step=1, model=torch.nn.Linear(8, 8))
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
    try:
        manager.save(step=2, model=torch.nn.Linear(512, 512))  # 1 MiB of weights
    except CheckpointSaveError as e:
        print(e)
        sys.exit(3)
    """
)


def _manager(root: Path) -> CheckpointManager:
    return CheckpointManager(CheckpointConfig(dir=str(root), keep_last=None))


def _assert_intact(root: Path) -> None:
    manager = _manager(root)
    assert [p.name for p in root.iterdir()] == ["step_00000001"]  # no partial save left
    assert manager.resolve() == root / "step_00000001"


def test_a_write_past_the_file_size_limit_is_refused_keeping_the_last_checkpoint(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ckpt"
    done = subprocess.run(
        [sys.executable, "-c", SAVE_PAST_LIMIT, str(root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    message = done.stdout.strip()
    assert message.startswith(
        f"saving checkpoint step_00000002 under {root} failed: a file is larger than this "
        "process may write (SafetensorError: "
    ), message
    assert f"the last complete checkpoint, {root / 'step_00000001'}, is intact" in message
    assert "raise `ulimit -f`, then resume" in message, message
    _assert_intact(root)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 5 MiB tmpfs at tmp_path/disk, unmounted afterwards; skipped where mounting fails."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(
            ["umount", "--lazy", str(disk)], check=True
        )  # a failed write may hold a file


def test_a_full_disk_is_refused_keeping_the_last_checkpoint(small_disk: Path) -> None:
    """torch's writer (the optimizer state) reports it without an errno: a nearly full disk at
    the failure says which."""
    root = small_disk / "ckpt"
    model = torch.nn.Linear(512, 512)  # 1 MiB of weights, 2 MiB of AdamW state
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 512)).sum().backward()
    optimizer.step()
    manager = _manager(root)
    manager.save(step=1, model=model, optimizer=optimizer)
    with pytest.raises(CheckpointSaveError) as e:
        manager.save(step=2, model=model, optimizer=optimizer)
    message = str(e.value)
    assert is_refusal(e.value) and "\n" not in message, message
    assert f"under {root} failed: the disk is full (the save had written " in message, message
    assert "MiB free; RuntimeError: " in message, message
    assert f"the last complete checkpoint, {root / 'step_00000001'}, is intact" in message
    _assert_intact(root)


def test_a_read_only_directory_is_refused_naming_it(small_disk: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    root = small_disk / "ckpt"
    with pytest.raises(CheckpointSaveError) as e:
        _manager(root).save(step=1, model=torch.nn.Linear(2, 2))
    message = str(e.value)
    assert is_refusal(e.value), message
    assert f"saving checkpoint step_00000001 under {root} failed: the file system is read-only" in (
        message
    )
    assert (
        "no earlier checkpoint was saved there: pass a checkpoint directory this process can "
        "write, then run again"
    ) in message, message


def test_an_error_that_is_not_the_file_systems_is_left_as_it_is(tmp_path: Path) -> None:
    """With room on the disk, a RuntimeError without an errno is some other fault: re-raised."""
    if shutil.disk_usage(tmp_path).free < FULL_BELOW_BYTES:
        pytest.skip("the disk holding tmp_path is nearly full itself")
    error = RuntimeError("a tensor on a device that went away")
    final = tmp_path / "ckpt" / "step_00000001"
    assert save_failed(error, final=final, scratch=tmp_path, last_complete=None) is None
