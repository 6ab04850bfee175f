"""A LoRA checkpoint resumed into a plain model (or the reverse) is refused in one sentence that
says once that it does not fit: the keys that differ, then the fix. It read "... does not fit the
model: the weights do not fit the model: ..." (a message wrapped in one that said the same)."""

from __future__ import annotations

from pathlib import Path

import pytest
from training_fakes import tiny_llama

from ludic.training.checkpoint_faults import CheckpointModelMismatchError, check_checkpoint_fits
from ludic.training.lora import add_lora

pytest.importorskip("peft")

CHECKPOINT = Path("run/checkpoints/step_00000001")


def _refusal(*, lora_model: bool, lora_checkpoint: bool) -> str:
    model = add_lora(tiny_llama(seed=0)) if lora_model else tiny_llama(seed=0)
    saved = add_lora(tiny_llama(seed=0)) if lora_checkpoint else tiny_llama(seed=0)
    with pytest.raises(CheckpointModelMismatchError) as refused:
        check_checkpoint_fits(model, saved.state_dict(), CHECKPOINT)
    return str(refused.value)


def test_a_lora_checkpoint_into_a_plain_model_reads_once() -> None:
    keys = [
        "base_model.model.lm_head.weight",
        "base_model.model.model.embed_tokens.weight",
        "base_model.model.model.layers.0.input_layernorm.weight",
        "base_model.model.model.layers.0.mlp.down_proj.weight",
        "base_model.model.model.layers.0.mlp.gate_proj.weight",
    ]
    assert _refusal(lora_model=False, lora_checkpoint=True) == (
        f"{CHECKPOINT} does not fit the model: unexpected keys {keys} (37 in the weights but not "
        "in the model). The checkpoint holds a LoRA adapter but this model is not LoRA-wrapped: "
        "wrap the base model with add_lora (same rank, alpha and target modules) before "
        "resuming, as that run did"
    )


def test_a_full_checkpoint_into_a_lora_model_reads_once() -> None:
    message = _refusal(lora_model=True, lora_checkpoint=False)
    assert message.startswith(f"{CHECKPOINT} does not fit the model: unexpected keys ['lm_head")
    assert message.count("fit the model") == 1, message
    assert "in the weights but not in the model). The checkpoint holds a full-parameter" in message
