"""A damaged generation_config.json is refused by `load_model` naming the file: transformers
ignores one that is not JSON without a word (the model then stops at config.json's eos ids, not
the saved ones), raises a bare TypeError for a JSON list, and keeps token ids that are no ids
(the embedded engine stops generating at `eos_token_id`). Fields ludic does not use (sampling
values: SamplingConfig sets them) are left to transformers' own warning."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ludic.errors import is_refusal
from ludic.models import load_model, tiny_model_dir

FILE = "generation_config.json"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_model_dir(), tmp_path / "m"))


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not valid JSON"),
        ("", "empty"),
        ("[2, 0]", "a JSON list, not the JSON object"),
        ('{"eos_token_id": "2"}', 'eos_token_id is "2", not a token id of this model'),
        ('{"eos_token_id": [2, 1000000]}', "eos_token_id is [2, 1000000], not a token id"),
        ('{"eos_token_id": -1}', "eos_token_id is -1, not a token id"),
    ],
)
def test_a_damaged_generation_config_is_refused_naming_the_file(
    folder: Path, content: str, problem: str
) -> None:
    (folder / FILE).write_text(content)
    with pytest.raises(ValueError) as e:
        load_model(folder)
    message = str(e.value)
    assert is_refusal(e.value) and "\n" not in message, message
    assert f"{folder / FILE}: {problem}" in message, message
    assert "restore the file saved with these weights" in message, message


@pytest.mark.parametrize("content", ['{"pad_token_id": -1}', '{"bos_token_id": 1.5}'])
def test_token_ids_the_engine_does_not_read_are_left_to_transformers(
    folder: Path, content: str
) -> None:
    # a pad_token_id of -1 is in older LLaMA conversions: transformers loads it, so ludic does
    (folder / FILE).write_text(content)
    load_model(folder)


def test_valid_token_ids_and_unused_fields_load(folder: Path) -> None:
    (folder / FILE).write_text('{"eos_token_id": [2, 0], "pad_token_id": null, "top_k": 5}')
    model, _ = load_model(folder)
    assert model.generation_config.eos_token_id == [2, 0]
