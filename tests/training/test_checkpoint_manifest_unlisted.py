"""A MANIFEST.json must list every file that holds trained state (the weights and model configs
under `model/`, and state.json, optimizer.pt, scheduler.pt, rng.pt, rank_states.pt): one that
lists fewer (an
empty `{"files": {}}`, an entry removed by hand, a manifest copied from another save) verified
anything, so a flipped weight loaded unnoticed. It is refused naming the unlisted file, by
resume and by `load_model`, and the earlier step that verifies is named and used. Other files
(a note left beside the checkpoint, a `.DS_Store`, a tokenizer added to `model/` later) need no
entry: the newest step stays the one resumed. An unreadable manifest is
refused by `load_model` too, as resume refuses it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from ludic.errors import is_refusal
from ludic.models import load_model, load_tiny_model
from ludic.training import CheckpointConfig, CheckpointManager, CorruptCheckpointError
from ludic.training.checkpoint_manifest import MANIFEST

Files = dict[str, dict[str, object]]


@pytest.fixture(scope="module")
def saved_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs") / "ckpt"
    model, tokenizer = load_tiny_model()
    manager = CheckpointManager(CheckpointConfig(dir=str(root), keep_last=None))
    for step in (1, 2):
        manager.save(step=step, model=model, tokenizer=tokenizer)
    return root


@pytest.fixture
def manager(saved_root: Path, tmp_path: Path) -> CheckpointManager:
    copy = tmp_path / "ckpt"
    shutil.copytree(saved_root, copy)
    return CheckpointManager(CheckpointConfig(dir=str(copy), keep_last=None))


def _edit_manifest(step_dir: Path, edit: Callable[[Files], None]) -> None:
    record = json.loads((step_dir / MANIFEST).read_text())
    edit(record["files"])
    (step_dir / MANIFEST).write_text(json.dumps(record))


def _flip_a_bit(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01
    file.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda files: files.clear(), "model/config.json is not listed in MANIFEST.json ("),
        (
            lambda files: files.pop("model/model.safetensors"),
            "model/model.safetensors is not listed in MANIFEST.json, so",
        ),
        (lambda files: files.pop("rng.pt"), "rng.pt is not listed in MANIFEST.json, so"),
    ],
    ids=["empty", "weights-unlisted", "rng-unlisted"],
)
def test_a_manifest_that_leaves_files_out_is_refused_and_the_earlier_step_used(
    manager: CheckpointManager, edit: Callable[[Files], None], named: str
) -> None:
    first, second = manager.path_for(1), manager.path_for(2)
    _edit_manifest(second, edit)
    _flip_a_bit(second / "model" / "model.safetensors")  # what the manifest no longer catches
    with pytest.raises(CorruptCheckpointError) as e:
        manager.resolve(second)
    message = str(e.value)
    assert f"{second} is damaged: {named}" in message, message
    assert str(first) in message, message  # the earlier step to use instead
    assert manager.resolve() == first  # resuming from the root: the newest that verifies


def test_load_model_refuses_a_checkpoint_whose_manifest_lists_no_files(
    manager: CheckpointManager,
) -> None:
    second = manager.path_for(2)
    _edit_manifest(second, lambda files: files.clear())
    with pytest.raises(ValueError) as e:
        load_model(second)
    message = str(e.value)
    assert is_refusal(e.value), message
    assert "model/config.json is not listed in MANIFEST.json" in message, message
    assert f"the earlier step {manager.path_for(1)} verifies" in message, message


def test_a_file_no_loading_reads_needs_no_entry(manager: CheckpointManager) -> None:
    second = manager.path_for(2)
    (second / "NOTES.txt").write_text("the run before the lr change\n")
    (second / "model" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (second / "model" / "special_tokens_map.json").write_text("{}")
    manager.verify(second)
    assert manager.resolve() == second
    load_model(second)


@pytest.mark.parametrize("content", ['{"files": 5}', "{", '{"step": 2}'])
def test_load_model_refuses_an_unreadable_manifest_as_resume_does(
    manager: CheckpointManager, content: str
) -> None:
    """It loaded the weights unverified, while resume refused the same checkpoint."""
    second = manager.path_for(2)
    (second / MANIFEST).write_text(content)
    with pytest.raises(CorruptCheckpointError):
        manager.resolve(second)
    with pytest.raises(ValueError) as e:
        load_model(second)
    message = str(e.value)
    assert f"{second / MANIFEST}: unreadable manifest" in message, message
    assert f"the earlier step {manager.path_for(1)} verifies" in message, message
