"""A LoRA run's checkpoint (`.../step_N/model` is a peft adapter directory) loads as the model it
trained: `load_model` (and so `ludic eval --model`, `ludic serve --model`) merges the adapter into
the base model the adapter names, instead of refusing the path "not a model directory, pass
.../step_N/model" (the path given). A base that is gone is refused naming it and the fix."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from ludic.models import load_model, load_tiny_model, load_tokenizer
from ludic.recipes.training import finish, make_trainer
from ludic.training import SAWBatch, add_lora
from ludic.training.algorithm import make_sft

pytest.importorskip("peft")

IDS = torch.tensor([[5, 17, 42, 99, 3, 250, 7]])


class NoBatches:
    """A source never drawn from: the run saves its step-0 checkpoint and stops."""

    async def next_batch(self) -> SAWBatch:
        raise AssertionError("not drawn")


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=IDS).logits


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor]:
    """A LoRA run's step-0 checkpoint (adapters with non-zero B) and the LoRA model's logits."""
    out = tmp_path_factory.mktemp("runs") / "lora"
    model, tokenizer = load_tiny_model()
    model = add_lora(model, rank=4, alpha=8, target_modules=("q_proj", "v_proj"))
    torch.manual_seed(0)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    trainer = make_trainer(model, tokenizer, make_sft(), NoBatches(), out=out, lr=1e-3)
    step_dir = finish(trainer)
    assert (step_dir / "model" / "adapter_config.json").is_file()
    return step_dir, _logits(trainer.model)


def test_loading_a_lora_checkpoint_prints_no_peft_deprecation(
    lora_run: tuple[Path, torch.Tensor],
) -> None:
    """transformers' FutureWarning about `is_gradient_checkpointing`, which peft triggers: noise
    on every `ludic serve`/`ludic eval` of a LoRA checkpoint that the user cannot act on."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_model(lora_run[0], dtype="float32")
    assert [str(w.message) for w in caught if "is_gradient_checkpointing" in str(w.message)] == []


def test_a_lora_checkpoint_loads_merged_into_its_base(lora_run: tuple[Path, torch.Tensor]) -> None:
    step_dir, expected = lora_run
    base, _ = load_tiny_model()
    assert not torch.allclose(_logits(base), expected, atol=1e-2)  # the adapters matter
    for path in (step_dir, step_dir / "model"):
        model, tokenizer = load_model(path, dtype="float32")
        assert not hasattr(model, "peft_config")  # a plain model: engines and trainers take it
        # merged into W, the adapters' products round differently than applied beside it
        torch.testing.assert_close(_logits(model), expected, atol=1e-4, rtol=0)
        assert tokenizer.encode("<move>4</move>") == load_tokenizer(step_dir).encode(
            "<move>4</move>"
        )


def test_a_lora_checkpoint_whose_base_is_gone_names_it(
    lora_run: tuple[Path, torch.Tensor], tmp_path: Path
) -> None:
    step_dir, _ = lora_run
    moved = tmp_path / "model"
    moved.mkdir()
    for f in (step_dir / "model").iterdir():
        moved.joinpath(f.name).write_bytes(f.read_bytes())
    config = json.loads((moved / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    (moved / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(FileNotFoundError) as e:
        load_model(moved)
    message = str(e.value)
    assert "LoRA adapter" in message and str(tmp_path / "gone") in message, message
    assert "base_model_name_or_path" in message, message
