"""Saving a model whose parameters `TrainerConfig.contiguous_parameters` laid out in one storage
(found in review): a plain torch module could not be saved at all (safetensors refused views
that do not cover their storage), and an HF model's checkpoint cloned every parameter on its
own device (transformers un-shares shared storage), a second model in GPU memory at every save
(the GPU check: tests/recipes/test_train_cuda.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from training_fakes import tiny_llama

from ludic.training import read_state_dict, save_weights
from ludic.training.contiguous_params import make_contiguous_


class Plain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 3)
        self.b = torch.nn.Linear(3, 2)


def test_a_plain_module_laid_out_back_to_back_saves_and_loads(tmp_path: Path) -> None:
    model = Plain()
    make_contiguous_(model)
    assert model.a.weight.untyped_storage().data_ptr() == model.b.bias.untyped_storage().data_ptr()
    save_weights(model, tmp_path)
    loaded = read_state_dict(tmp_path)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=0)


def test_an_hf_model_laid_out_back_to_back_is_written_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_llama(seed=0)
    make_contiguous_(model)
    seen: dict[str, Any] = {}
    original = type(model).save_pretrained

    def spy(self: Any, directory: str, **kwargs: Any) -> Any:
        seen["keys"] = set(kwargs.get("state_dict") or ())  # transformers empties it
        return original(self, directory, **kwargs)

    monkeypatch.setattr(type(model), "save_pretrained", spy)
    save_weights(model, tmp_path)
    assert seen["keys"] == set(model.state_dict())  # handed over (copied to host off the CPU)
    loaded = read_state_dict(tmp_path)
    for name, tensor in model.state_dict().items():
        if name in loaded:  # tied lm_head may be omitted, as HF does
            torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=0)
