"""README "Multi-process training (FSDP2)" with `add_lora`: an embedded engine built from the
LoRA-wrapped model (`EmbeddedEngine(copy.deepcopy(model))` after `add_lora`) cannot take the
merged weights the Trainer publishes under the base model's names. The first publish refuses
them; the refusal says the served model is LoRA-wrapped and how to serve the base model, where
it only said the names were unknown."""

from __future__ import annotations

import copy

import pytest

from ludic.distributed import InProcessPublisher
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.models import build_tiny_model

pytest.importorskip("peft")


def test_publishing_into_a_lora_wrapped_engine_names_the_fix() -> None:
    from ludic.training import add_lora

    base, tokenizer = build_tiny_model(seed=0)
    wrapped = add_lora(copy.deepcopy(base), rank=4, alpha=8)
    engine = EmbeddedEngine(copy.deepcopy(wrapped), tokenizer)
    try:
        with pytest.raises(ValueError) as refused:
            InProcessPublisher(engine).publish(base.state_dict(), version=0)
    finally:
        engine.close()
    message = str(refused.value)
    assert "unknown tensor names" in message
    assert "LoRA-wrapped" in message and "before add_lora" in message


def test_a_plain_engine_with_foreign_names_gets_no_lora_hint() -> None:
    base, tokenizer = build_tiny_model(seed=0)
    engine = EmbeddedEngine(copy.deepcopy(base), tokenizer)
    try:
        foreign = {f"other.{name}": t for name, t in base.state_dict().items()}
        with pytest.raises(ValueError) as refused:
            InProcessPublisher(engine).publish(foreign, version=0)
    finally:
        engine.close()
    assert "unknown tensor names" in str(refused.value)
    assert "LoRA" not in str(refused.value)
