"""A MANIFEST.json whose entries `write_manifest` never writes (edited by hand, damaged) is
refused as an unreadable manifest naming the entry, not compared as it is: a size written as a
string was reported as 'has 123 bytes, the manifest says 123', a sha256 that is no hex digest as
the file's contents having changed, and an entry naming a file outside the checkpoint was read
and could verify. Resuming from the root falls back to the newest good checkpoint, as for any
corrupt one."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ludic.training.checkpoint import CheckpointConfig, CheckpointManager
from ludic.training.checkpoint_manifest import MANIFEST
from ludic.training.weights_io import CorruptCheckpointError

Files = dict[str, dict[str, object]]


def _size_as_text(files: Files) -> None:
    files["state.json"]["size"] = str(files["state.json"]["size"])


def _sha_as_number(files: Files) -> None:
    files["state.json"]["sha256"] = 5


def _outside_file(files: Files) -> None:
    files["../outside.txt"] = {"size": 2, "sha256": hashlib.sha256(b"hi").hexdigest()}


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (_size_as_text, "entry 'state.json' has size '"),
        (_sha_as_number, "entry 'state.json' has sha256 5, not 64 hex digits"),
        (_outside_file, "entry '../outside.txt' is not a path inside the checkpoint"),
    ],
    ids=["size-as-text", "sha-as-number", "outside-path"],
)
def test_a_malformed_manifest_entry_is_named_and_the_earlier_step_used(
    tmp_path: Path, edit: Callable[[Files], None], named: str
) -> None:
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path / "ckpt"), keep_last=None))
    model = torch.nn.Linear(2, 2)
    good = manager.save(step=1, model=model)
    edited = manager.save(step=2, model=model)
    (edited.parent / "outside.txt").write_bytes(b"hi")
    manifest = edited / MANIFEST
    record = json.loads(manifest.read_text())
    edit(record["files"])
    manifest.write_text(json.dumps(record))

    with pytest.raises(CorruptCheckpointError) as e:
        manager.resolve(edited)
    message = str(e.value)
    assert f"{manifest}: unreadable manifest" in message and named in message, message
    assert str(good) in message, message  # the earlier step to use instead
    assert manager.resolve() == good  # the root: the newest that verifies
