"""A checkpoint holds what it takes to load and serve it: the tokenizer comes from
`Trainer(tokenizer=...)` or the local directory the model was loaded from; without either the
Trainer warns at construction, and loading the tokenizer-less checkpoint says what is missing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from training_fakes import ListSource, WeightedNLL, mixed_items

from ludic.models import build_tiny_model, load_model, save_model
from ludic.training import CheckpointConfig, ConstantCredit, RLAlgorithm, Trainer, TrainerConfig

ALGORITHM = RLAlgorithm(name="test", credit_assigner=ConstantCredit(value=1.0), loss=WeightedNLL())


def trainer(model: object, tmp_path: Path, **kwargs: object) -> Trainer:
    config = TrainerConfig(lr=1e-3, checkpoint=CheckpointConfig(dir=str(tmp_path / "ckpt")))
    source = ListSource([mixed_items(2)])
    return Trainer(model, ALGORITHM, source, config, **kwargs)  # type: ignore[arg-type]


def test_without_a_tokenizer_the_trainer_warns_and_loading_names_the_gap(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, _ = build_tiny_model(seed=0)  # built in memory: no directory to take one from
    with caplog.at_level(logging.WARNING, logger="ludic.training.trainer"):
        t = trainer(model, tmp_path)
    assert "will hold no tokenizer" in caplog.text and "tokenizer=tokenizer" in caplog.text
    path = t.save_checkpoint()
    t.close()
    with pytest.raises(FileNotFoundError, match="holds no tokenizer") as e:
        load_model(path / "model")
    assert "load_tokenizer(SOURCE_DIR).save_pretrained(DIR)" in str(e.value), e.value


def test_the_hint_for_a_checkpoint_without_a_tokenizer_loads(tmp_path: Path) -> None:
    """Following it loads the model: the tokenizer saved into the checkpoint itself needs no
    MANIFEST.json entry (only weights, model configs and the step's own files do), and the
    weights are still verified."""
    model, tokenizer = build_tiny_model(seed=0)
    t = trainer(model, tmp_path)
    path = t.save_checkpoint()
    t.close()
    tokenizer.save_pretrained(path / "model")
    assert load_model(path / "model")[1].encode("<move>4</move>") == tokenizer.encode(
        "<move>4</move>"
    )


def test_the_tokenizer_of_the_models_own_directory_is_saved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, tokenizer = build_tiny_model(seed=0)
    loaded, _ = load_model(save_model(model, tokenizer, tmp_path / "base"))
    with caplog.at_level(logging.WARNING, logger="ludic.training.trainer"):
        t = trainer(loaded, tmp_path)
    assert "no tokenizer" not in caplog.text
    path = t.save_checkpoint()
    t.close()
    _, back = load_model(path / "model")
    text = "<move>5</move> hello"
    assert back.encode(text) == tokenizer.encode(text)


def test_an_explicit_tokenizer_is_saved_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, tokenizer = build_tiny_model(seed=0)
    with caplog.at_level(logging.WARNING, logger="ludic.training.trainer"):
        t = trainer(model, tmp_path, tokenizer=tokenizer)
    assert "no tokenizer" not in caplog.text
    path = t.save_checkpoint()
    t.close()
    load_model(path / "model")
