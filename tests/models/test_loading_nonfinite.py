"""A model directory whose weights hold a NaN or an infinity (saved from a diverged run, or
edited) is refused by `load_model` (so `ludic eval --model`, `ludic serve --model`) naming the
tensor, instead of loading a model whose logits are NaN. A LoRA adapter's NaN, which spreads
into its base layers when merged, is refused naming the adapter's folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ludic.errors import is_refusal
from ludic.models import load_model, load_tiny_model, tiny_model_dir

WEIGHTS = "model.safetensors"
TENSOR = "model.layers.1.mlp.down_proj.weight"


def _poisoned(tmp_path: Path, value: float, count: int) -> Path:
    folder = tmp_path / "m"
    shutil.copytree(tiny_model_dir(), folder)
    tensors = load_file(folder / WEIGHTS)
    tensors[TENSOR].view(-1)[:count] = value
    save_file(tensors, folder / WEIGHTS, metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize(
    ("value", "counts"),
    [(float("nan"), "has 3 NaN and 0 infinite"), (float("-inf"), "has 0 NaN and 3 infinite")],
    ids=["nan", "inf"],
)
def test_weights_holding_non_finite_values_are_refused_naming_the_tensor(
    tmp_path: Path, value: float, counts: str
) -> None:
    folder = _poisoned(tmp_path, value, count=3)
    with pytest.raises(ValueError) as e:
        load_model(folder)
    message = str(e.value)
    assert is_refusal(e.value) and "\n" not in message, message
    assert f"{folder}: the weights hold non-finite values: {TENSOR} {counts}" in message, message
    assert "load an earlier checkpoint" in message, message


def test_finite_weights_load(tmp_path: Path) -> None:
    """The check refuses only what is non-finite: the largest finite float32 loads."""
    folder = _poisoned(tmp_path, torch.finfo(torch.float32).max, count=3)
    model, _ = load_model(folder)
    assert model.get_parameter(TENSOR).view(-1)[0] == torch.finfo(torch.float32).max


def test_a_lora_adapter_holding_nan_is_refused_naming_its_folder(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    from ludic.training import add_lora

    model, tokenizer = load_tiny_model()
    model = add_lora(model, rank=4, alpha=8, target_modules=("q_proj",))
    name = next(n for n, _ in model.named_parameters() if "layers.0" in n and "lora_B" in n)
    with torch.no_grad():
        model.get_parameter(name).fill_(float("nan"))
    adapter = tmp_path / "adapter"
    model.save_pretrained(adapter)
    tokenizer.save_pretrained(adapter)
    with pytest.raises(ValueError) as e:
        load_model(adapter)
    message = str(e.value)
    assert f"{adapter}: the weights hold non-finite values: " in message, message
    assert "model.layers.0.self_attn.q_proj.weight" in message, message
