"""A checkpoint whose weights changed after the save without changing size (a bit flip on disk
or in a copy) is refused by `load_model` (`ludic eval --model`, `ludic serve --model`) and by
resume, naming the file, "damaged" and the earlier step that verifies, instead of loading the
flipped weights silently. Checkpoints saved before manifests held checksums still load, with
their sizes checked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ludic.errors import is_refusal
from ludic.models import load_model, load_tiny_model
from ludic.training import CheckpointConfig, CheckpointManager, CorruptCheckpointError

WEIGHTS = "model/model.safetensors"


@pytest.fixture(scope="module")
def saved_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two checkpoints (steps 1 and 2) of the tiny model, with its tokenizer: kept pristine."""
    root = tmp_path_factory.mktemp("runs") / "ckpt"
    model, tokenizer = load_tiny_model()
    manager = CheckpointManager(CheckpointConfig(dir=str(root)))
    for step in (1, 2):
        manager.save(step=step, model=model, tokenizer=tokenizer)
    return root


def _flip_a_bit(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the tensor data: same size, a valid safetensors file
    file.write_bytes(bytes(data))


@pytest.fixture()
def checkpoints(saved_root: Path, tmp_path: Path) -> tuple[CheckpointManager, Path, Path]:
    copy = tmp_path / "ckpt"
    shutil.copytree(saved_root, copy)
    manager = CheckpointManager(CheckpointConfig(dir=str(copy)))
    first, second = manager.path_for(1), manager.path_for(2)
    return manager, first, second


def test_a_bit_flip_is_refused_by_load_model_naming_the_file_and_the_earlier_step(
    checkpoints: tuple[CheckpointManager, Path, Path],
) -> None:
    _, first, second = checkpoints
    _flip_a_bit(second / WEIGHTS)
    for path in (second, second / "model"):
        with pytest.raises(ValueError) as e:
            load_model(path)
        message = str(e.value)
        assert WEIGHTS in message and "damaged" in message and "sha256" in message, message
        assert f"the earlier step {first} verifies" in message, message
        assert is_refusal(e.value)
    load_model(first)  # the step it names loads


def test_a_bit_flip_is_refused_at_resume_naming_the_earlier_step(
    checkpoints: tuple[CheckpointManager, Path, Path],
) -> None:
    manager, first, second = checkpoints
    _flip_a_bit(second / WEIGHTS)
    with pytest.raises(CorruptCheckpointError) as e:
        manager.load(second)
    message = str(e.value)
    assert f"{second} is damaged: {WEIGHTS} does not match its sha256" in message, message
    assert f"Use an earlier step: the newest complete checkpoint is {first}" in message, message
    assert manager.load().step == 1  # given the root, resume takes the earlier step itself


def test_the_only_checkpoint_damaged_says_none_other_verifies(
    checkpoints: tuple[CheckpointManager, Path, Path],
) -> None:
    manager, first, second = checkpoints
    shutil.rmtree(second)
    _flip_a_bit(first / WEIGHTS)
    with pytest.raises(ValueError, match="no earlier step beside it verifies"):
        load_model(first)
    with pytest.raises(CorruptCheckpointError, match=r"No other checkpoint .* verifies"):
        manager.load(first)


def _drop_checksums(step_dir: Path) -> None:
    """As manifests were written before they held sha256s: sizes only."""
    manifest = step_dir / "MANIFEST.json"
    data = json.loads(manifest.read_text())
    data["files"] = {name: {"size": e["size"]} for name, e in data["files"].items()}
    manifest.write_text(json.dumps(data))


def test_a_checkpoint_saved_without_checksums_still_loads_size_checked(
    checkpoints: tuple[CheckpointManager, Path, Path],
) -> None:
    manager, _, second = checkpoints
    _drop_checksums(second)
    model, _ = load_model(second, dtype="float32")
    expected, _ = load_tiny_model()
    for name, tensor in expected.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, atol=0, rtol=0)
    assert manager.load(second).step == 2
    assert manager.load().step == 2
    weights = second / WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-8])
    with pytest.raises(ValueError, match=r"model\.safetensors has \d+ bytes"):
        load_model(second)
    with pytest.raises(CorruptCheckpointError, match=r"model\.safetensors has \d+ bytes"):
        manager.load(second)


def test_a_quarantined_checkpoint_names_the_earlier_step_that_verifies(
    checkpoints: tuple[CheckpointManager, Path, Path],
) -> None:
    """Resume renames a damaged step `step_N.corrupt`; loading it by that name still points at
    the newest earlier step that verifies (it said none did)."""
    _, first, second = checkpoints
    _flip_a_bit(second / WEIGHTS)
    quarantined = second.rename(second.with_name(second.name + ".corrupt"))
    with pytest.raises(ValueError) as e:
        load_model(quarantined)
    assert f"the earlier step {first} verifies" in str(e.value), str(e.value)
