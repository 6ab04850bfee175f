"""A model directory edited by hand or assembled from two models is refused by `load_model` (so
`ludic eval --model`, `ludic serve`) in one line naming the file, the problem and the fix, never
loaded with tensors transformers initialised at random or dropped: a config.json that is not a
JSON object or holds values transformers rejects, weights that do not fit config.json (another
shape, fewer or more layers, a missing tensor), and tokenizer files that are not JSON or do not
load, or that hold more tokens than the model's embedding has rows."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from ludic.errors import is_refusal
from ludic.models import load_model, load_tiny_model, save_model

WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, tokenizer = load_tiny_model()
    return save_model(model, tokenizer, tmp_path_factory.mktemp("hostile") / "plain")


def _copy(saved: Path, tmp_path: Path, edit: Callable[[Path], None]) -> Path:
    folder = tmp_path / "m"
    shutil.copytree(saved, folder)
    edit(folder)
    return folder


def _edit_config(**changes: object) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        for key, change in changes.items():
            config[key] = change(config[key]) if callable(change) else change
        (folder / "config.json").write_text(json.dumps(config))

    return edit


def _edit_weights(change: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        tensors = load_file(folder / WEIGHTS)
        change(tensors)
        save_file(tensors, folder / WEIGHTS, metadata={"format": "pt"})

    return edit


def _refusal(folder: Path) -> str:
    with pytest.raises(ValueError) as e:
        load_model(folder)
    message = str(e.value)
    assert is_refusal(e.value), message
    assert "\n" not in message, message  # one line, not transformers' LOAD REPORT table
    return message


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "empty"),
        (b"[1, 2]", "a JSON list, not the JSON object"),
        (b'\xff\xfe{"a": 1}', "not UTF-8"),
    ],
)
def test_a_config_json_that_is_no_json_object_is_named_not_blamed_on_the_weights(
    saved: Path, tmp_path: Path, content: bytes, problem: str
) -> None:
    folder = _copy(saved, tmp_path, lambda f: (f / "config.json").write_bytes(content))
    message = _refusal(folder)
    assert f"{folder / 'config.json'}: {problem}" in message, message
    assert "weights are missing" not in message, message


@pytest.mark.parametrize(
    "changes",
    [{"hidden_size": "256"}, {"num_attention_heads": 3}],
    ids=["wrong-type", "heads-not-dividing-hidden"],
)
def test_config_values_transformers_rejects_are_refused_naming_config_json(
    saved: Path, tmp_path: Path, changes: dict[str, object]
) -> None:
    folder = _copy(saved, tmp_path, _edit_config(**changes))
    message = _refusal(folder)
    assert f"{folder}: transformers cannot build a model from its config.json" in message, message


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (_edit_config(num_hidden_layers=lambda n: n + 1), "needs model.layers.4."),
        (_edit_config(num_hidden_layers=lambda n: n - 1), "the weights hold model.layers.3."),
        (_edit_config(hidden_size=lambda n: n * 2), "in the weights but"),
        (_edit_config(vocab_size=lambda n: n + 10), "lm_head.weight is"),
        (
            _edit_weights(lambda t: t.pop("model.layers.0.mlp.down_proj.weight")),
            "needs model.layers.0.mlp.down_proj.weight, which the weights lack",
        ),
    ],
    ids=["more-layers", "fewer-layers", "wider", "larger-vocab", "tensor-missing"],
)
def test_weights_that_do_not_fit_config_json_are_refused_not_filled_at_random(
    saved: Path, tmp_path: Path, edit: Callable[[Path], None], problem: str
) -> None:
    """transformers loads the first two (random new layer; a layer dropped) and the last
    (a random tensor) with only a warning table, and the middle two raise 'look at the above
    report'."""
    folder = _copy(saved, tmp_path, edit)
    message = _refusal(folder)
    assert f"{folder}: the weights do not fit config.json" in message, message
    assert problem in message and "restore the config.json and weights" in message, message


def test_tied_embeddings_and_an_extra_head_still_load(saved: Path, tmp_path: Path) -> None:
    """A tied lm_head absent from the file is not missing, and a tensor outside the backbone (a
    value head saved beside the LM) is not the config's model being too small."""
    _, tokenizer = load_model(saved)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    folder = save_model(LlamaForCausalLM(config), tokenizer, tmp_path / "tied")
    _edit_weights(lambda t: t.update({"v_head.weight": torch.zeros(1, 32)}))(folder)
    model, _ = load_model(folder)
    assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("tokenizer.json", b"{garbage", "not valid JSON"),
        ("tokenizer.json", b"", "empty"),
        ("tokenizer.json", b"[]", "a JSON list"),
        ("tokenizer_config.json", b"[]", "a JSON list"),
        ("tokenizer_config.json", b"{garbage", "not valid JSON"),
    ],
)
def test_tokenizer_files_that_are_no_json_object_are_named(
    saved: Path, tmp_path: Path, name: str, content: bytes, problem: str
) -> None:
    folder = _copy(saved, tmp_path, lambda f: (f / name).write_bytes(content))
    assert f"{folder / name}: {problem}" in _refusal(folder)


def test_a_tokenizer_that_does_not_load_is_refused_naming_the_folder(
    saved: Path, tmp_path: Path
) -> None:
    """tokenizer_config.json without its tokenizer.json: transformers' multi-line ValueError
    about sentencepiece, worded as one line naming the folder and the fix."""
    folder = _copy(saved, tmp_path, lambda f: (f / "tokenizer.json").unlink())
    message = _refusal(folder)
    assert f"{folder}: the tokenizer does not load from its files" in message, message
    assert "copy tokenizer.json and tokenizer_config.json again" in message, message


def test_a_tokenizer_larger_than_the_embedding_is_refused(saved: Path, tmp_path: Path) -> None:
    """Ids past the embedding's last row would crash generation (or read garbage on a GPU)."""

    def grow_vocab(folder: Path) -> None:
        tokenizer = json.loads((folder / "tokenizer.json").read_text())
        vocab = tokenizer["model"]["vocab"]
        size = len(vocab)
        vocab.update({f"extra{i}": size + i for i in range(200)})
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer))

    folder = _copy(saved, tmp_path, grow_vocab)
    rows = json.loads((folder / "config.json").read_text())["vocab_size"]
    message = _refusal(folder)
    assert f"the tokenizer has {rows + 200} tokens but the model's embedding only {rows}" in (
        message
    ), message
