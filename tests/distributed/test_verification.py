"""Verification maths: probe comparison, the error message, and reference logprobs."""

from __future__ import annotations

import math

import pytest
import torch
from distributed_fakes import SPEC

from ludic.distributed import PublishVerificationError
from ludic.distributed.verification import (
    check_served_policy,
    compare_logprobs,
    default_probe_tokens,
    reference_logprobs,
    reference_logprobs_from_state,
    vocab_size_of,
)
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.models import build_tiny_model


def test_compare_reports_worst_gap_and_positions() -> None:
    got = compare_logprobs([-1.0, -2.0, -3.0, -4.0], [-1.0, -2.5, -3.0005, math.nan], atol=1e-3)
    assert got.positions == (1, 3)  # 0.5 > atol, nan is a gap; 0.0005 is within atol
    assert got.max_abs_diff == math.inf


def test_check_passes_when_version_and_probe_match() -> None:
    check_served_policy(
        version=4, served_version=4, expected_logprobs=[-1.0], served_logprobs=[-1.0], atol=0
    )


def test_check_says_what_diverged() -> None:
    with pytest.raises(PublishVerificationError) as info:
        check_served_policy(
            version=5,
            served_version=4,
            expected_logprobs=[-1.0, -2.0, -3.0],
            served_logprobs=[-1.0, -2.25, -3.5],
            atol=1e-3,
        )
    message = str(info.value)
    assert "reports policy version 4, expected 5" in message
    assert "differ from the trainer's by up to 0.5" in message
    assert "at 2 of 3 positions [1, 2]" in message


def test_probe_alone_catches_a_version_only_update() -> None:
    with pytest.raises(PublishVerificationError, match=r"up to 0\.1") as info:
        check_served_policy(
            version=2, served_version=2, expected_logprobs=[-1.0], served_logprobs=[-1.1], atol=1e-3
        )
    assert "policy version" not in str(info.value)


def test_length_mismatch_is_an_error() -> None:
    with pytest.raises(PublishVerificationError, match="returned 1 probe logprobs"):
        compare_logprobs([-1.0, -2.0], [-1.0], atol=1e-3)


def test_default_probe_is_fixed_and_in_vocab() -> None:
    a, b = default_probe_tokens(50), default_probe_tokens(50)
    assert a == b and len(a) == 16 and all(0 <= t < 50 for t in a)
    with pytest.raises(ValueError):
        default_probe_tokens(50, length=1)


def test_reference_logprobs_match_the_engine_probe() -> None:
    model, tokenizer = build_tiny_model(seed=0, spec=SPEC)
    ids = default_probe_tokens(vocab_size_of(model))
    model.train()  # reference_logprobs switches to eval and back
    expected = reference_logprobs(model, ids)
    assert model.training
    with EmbeddedEngine(model, tokenizer) as engine:
        served = engine.logprobs(ids)
    assert torch.allclose(torch.tensor(expected), torch.tensor(served), atol=1e-5)


def test_the_twin_reference_equals_the_models_own() -> None:
    model, _ = build_tiny_model(seed=0, spec=SPEC)
    ids = default_probe_tokens(vocab_size_of(model))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert reference_logprobs_from_state(model, state, ids) == reference_logprobs(model, ids)


def test_the_twin_of_a_lora_model_runs_the_merged_weights() -> None:
    from ludic.training import add_lora
    from ludic.training.lora import inference_weights

    base, _ = build_tiny_model(seed=0, spec=SPEC)
    ids = default_probe_tokens(vocab_size_of(base))
    untouched = reference_logprobs(base, ids)
    lora = add_lora(base, rank=4, alpha=8, target_modules=("q_proj", "v_proj"))
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    merged = inference_weights(lora, lora.state_dict())  # what a LoRA trainer publishes
    got = reference_logprobs_from_state(lora, merged, ids)
    expected = reference_logprobs(lora, ids)  # the adapters' forward
    assert torch.allclose(torch.tensor(got), torch.tensor(expected), atol=1e-5)
    assert not torch.allclose(torch.tensor(got), torch.tensor(untouched), atol=1e-3)


def test_a_twin_needs_the_weights_and_a_config() -> None:
    model, _ = build_tiny_model(seed=0, spec=SPEC)
    state = dict(model.state_dict())
    del state["model.norm.weight"]
    with pytest.raises(ValueError, match=r"do not cover .*model\.norm\.weight"):
        reference_logprobs_from_state(model, state, [1, 2, 3])
    with pytest.raises(ValueError, match="no Hugging Face config"):
        reference_logprobs_from_state(torch.nn.Linear(2, 2), {}, [1, 2, 3])
