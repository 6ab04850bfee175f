"""Tokenizer files from another model, as small as the model's vocabulary (so not caught as
larger than the embedding), are refused by `load_model` when an id the model stops generating
at (its eos_token_id) is an ordinary token of that tokenizer: the engine would stop at that
word, and every id would mean other text. The model's own tokenizer loads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from ludic.errors import is_refusal
from ludic.models import load_model, tiny_model_dir


def _foreign_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer whose id 2 (the tiny model's <|im_end|>) is the word 'the'."""
    vocab = {word: i for i, word in enumerate(["a", "b", "the", "cat", "[UNK]"])}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, unk_token="[UNK]", eos_token="<|im_end|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|endoftext|>"]})
    return tokenizer


def test_a_tokenizer_from_another_model_is_refused_naming_the_eos_token(tmp_path: Path) -> None:
    folder = Path(shutil.copytree(tiny_model_dir(), tmp_path / "m"))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name).unlink()
    _foreign_tokenizer().save_pretrained(folder)
    with pytest.raises(ValueError) as e:
        load_model(folder)
    message = str(e.value)
    assert is_refusal(e.value) and "\n" not in message, message
    assert (
        f"{folder}: the model stops generating at token id 2 (its eos_token_id), which the "
        "tokenizer holds as the ordinary token 'the', not a special token"
    ) in message, message


def test_the_models_own_tokenizer_loads() -> None:
    _, tokenizer = load_model(tiny_model_dir())
    assert tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
