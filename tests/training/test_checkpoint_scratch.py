"""Temporary directories of killed checkpoint saves are removed at start-up and at retention,
never one that a live process is still writing (issue 27, section 4)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from training_fakes import tiny_llama

from ludic.training import CheckpointConfig, CheckpointManager
from ludic.training.checkpoint_scratch import (
    UNOWNED_GRACE_S,
    scratch_name,
    this_host,
    this_writer,
    writer_of,
)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def scratch(root: Path, name: str) -> Path:
    path = root / name
    (path / "model").mkdir(parents=True)
    (path / "model" / "model.safetensors").write_bytes(b"x" * 1000)
    return path


def test_names_record_the_writer() -> None:
    name = scratch_name("tmp", "step_00000003")
    assert name.startswith(".tmp-step_00000003-")
    assert writer_of(name) == this_writer()
    assert this_writer().is_alive()
    assert writer_of(".tmp-step_00000003-0123abcd") is None  # written before owners were named


def test_start_up_removes_dead_writers_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "ckpt"
    me = this_writer()
    dead = scratch(root, f".tmp-step_00000002-aaaaaaaa-{dead_pid()}-0-{this_host()}")
    old_swap = scratch(root, f".old-step_00000001-bbbbbbbb-{dead_pid()}-0-{this_host()}")
    live = scratch(root, f".tmp-step_00000004-cccccccc-{me.pid}-{me.start}-{this_host()}")
    # Same pid, another start time: the writer died and its pid went to someone else.
    reused = scratch(root, f".tmp-step_00000005-dddddddd-{me.pid}-{me.start + 1}-{this_host()}")
    foreign = scratch(root, f".tmp-step_00000006-eeeeeeee-{me.pid}-{me.start}-other-host")
    unowned_old = scratch(root, ".tmp-step_00000007-0123abcd")
    long_ago = time.time() - UNOWNED_GRACE_S - 60
    for path in [unowned_old, *unowned_old.rglob("*")]:
        os.utime(path, (long_ago, long_ago))
    unowned_recent = scratch(root, ".tmp-step_00000008-4567abcd")
    unrelated = scratch(root, "notes")

    with caplog.at_level(logging.WARNING):
        CheckpointManager(CheckpointConfig(dir=str(root)))

    assert not dead.exists() and not old_swap.exists() and not reused.exists()
    # the aside of a re-save killed between its renames, its step_N gone: renamed back
    assert (root / "step_00000001" / "model" / "model.safetensors").is_file()
    assert not unowned_old.exists()
    assert live.exists() and foreign.exists() and unowned_recent.exists() and unrelated.exists()
    assert "another host" in caplog.text and foreign.name in caplog.text


def test_retention_removes_dead_writers_too(tmp_path: Path) -> None:
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path / "ckpt"), keep_last=1))
    manager.save(step=1, model=tiny_llama())
    dead = scratch(manager.root, f".tmp-step_00000002-aaaaaaaa-{dead_pid()}-0-{this_host()}")
    manager.save(step=2, model=tiny_llama())
    assert not dead.exists()
    assert [p.name for p in manager.root.iterdir()] == ["step_00000002"]


HANGING_SAVE = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[2])
    from training_fakes import tiny_llama
    from ludic.training import CheckpointConfig, CheckpointManager
    import ludic.training.checkpoint as checkpoint

    def hang(self, tmp, step):
        print("writing", flush=True)
        time.sleep(600)

    checkpoint.CheckpointManager._write_manifest = hang
    CheckpointManager(CheckpointConfig(dir=sys.argv[1])).save(step=5, model=tiny_llama())
    """
)


def test_a_save_in_progress_survives_until_its_writer_is_killed(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    writer = subprocess.Popen(
        [sys.executable, "-c", HANGING_SAVE, str(root), str(Path(__file__).parent)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
        (in_progress,) = root.glob(".tmp-step_00000005-*")
        recorded = writer_of(in_progress.name)
        assert recorded is not None and recorded.pid == writer.pid and recorded.is_alive()
        # Another process starting on the same directory, and its saves, leave it alone.
        manager = CheckpointManager(CheckpointConfig(dir=str(root), keep_last=1))
        manager.save(step=1, model=tiny_llama())
        assert in_progress.exists() and (in_progress / "model").is_dir()
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    CheckpointManager(CheckpointConfig(dir=str(root)))  # the next start-up
    assert not in_progress.exists()
    assert sorted(p.name for p in root.iterdir()) == ["step_00000001"]
