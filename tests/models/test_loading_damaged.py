"""A checkpoint whose weights are missing or cut short (copied in part, a full disk) is refused
by `load_model` (so `ludic eval --model`, `ludic serve --model`) with a ValueError naming the file
and the fix, not transformers' OSError or safetensors' "invalid header length" traceback. A step
folder is checked against its MANIFEST.json; a plain model folder by loading it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ludic.errors import is_refusal
from ludic.models import load_model, load_tiny_model
from ludic.recipes.training import finish, make_trainer
from ludic.training import SAWBatch
from ludic.training.algorithm import make_sft


class NoBatches:
    async def next_batch(self) -> SAWBatch:
        raise AssertionError("not drawn")


@pytest.fixture(scope="module")
def step_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "x"
    model, tokenizer = load_tiny_model()
    return finish(make_trainer(model, tokenizer, make_sft(), NoBatches(), out=out, lr=1e-3))


def _damaged(step_dir: Path, tmp_path: Path, how: str) -> Path:
    copy = tmp_path / step_dir.name
    shutil.copytree(step_dir, copy)
    weights = copy / "model" / "model.safetensors"
    if how == "missing":
        weights.unlink()
    else:
        weights.write_bytes(weights.read_bytes()[:1000])
    return copy


@pytest.mark.parametrize("how", ["missing", "truncated"])
def test_a_damaged_step_folder_is_refused_naming_the_file(
    step_dir: Path, tmp_path: Path, how: str
) -> None:
    copy = _damaged(step_dir, tmp_path, how)
    for path in (copy, copy / "model"):
        with pytest.raises(ValueError) as e:
            load_model(path)
        message = str(e.value)
        assert "model.safetensors" in message and "another checkpoint" in message, message
        assert is_refusal(e.value)


def test_a_damaged_plain_model_folder_is_refused_naming_it(step_dir: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    shutil.copytree(step_dir / "model", plain)
    weights = plain / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ValueError) as e:
        load_model(plain)
    assert str(plain) in str(e.value) and "damaged" in str(e.value), str(e.value)
    assert is_refusal(e.value)


def test_a_config_without_model_type_is_refused_naming_it(tmp_path: Path) -> None:
    """A folder whose config.json transformers cannot build a model from (no model_type) is a
    refusal naming the folder, not transformers' traceback."""
    model, tokenizer = load_tiny_model()
    folder = tmp_path / "m"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = folder / "config.json"
    config.write_text(config.read_text().replace('"model_type"', '"not_model_type"'))
    with pytest.raises(ValueError, match=r"cannot build a model from its config\.json") as e:
        load_model(folder)
    assert str(folder) in str(e.value) and is_refusal(e.value)
