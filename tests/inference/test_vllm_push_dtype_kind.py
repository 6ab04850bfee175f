"""The vLLM extension's `/start` check refuses a manifest that sends a tensor in another dtype
kind than the checkpoint vLLM serves holds it (a float tensor for an int buffer, or the
reverse), naming the tensor and both dtypes, before anything is received; floats of another
width (a bf16 wire for an fp32 checkpoint, or vLLM serving it in bf16) pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ludic.distributed.manifest import ManifestError, plan_manifest
from ludic.inference.vllm.routes import check_push_shapes

SERVED = {"layer.weight": torch.zeros(4, 4), "layer.steps": torch.arange(3)}


@pytest.fixture
def model_dir(tmp_path: Path) -> str:
    save_file(SERVED, str(tmp_path / "model.safetensors"))
    return str(tmp_path)


def test_a_float_tensor_for_an_int_buffer_is_refused_naming_both_dtypes(model_dir: str) -> None:
    sent = {**SERVED, "layer.steps": SERVED["layer.steps"].float()}
    manifest = plan_manifest(sent, version=1, bucket_bytes=1 << 20)
    with pytest.raises(ManifestError) as caught:
        check_push_shapes(manifest, model_dir)
    message = str(caught.value)
    assert "layer.steps: sent float32, served int64" in message and model_dir in message
    assert "nothing was loaded" in message


def test_an_int_tensor_for_a_float_weight_is_refused(model_dir: str) -> None:
    sent = {**SERVED, "layer.weight": SERVED["layer.weight"].long()}
    manifest = plan_manifest(sent, version=1, bucket_bytes=1 << 20)
    with pytest.raises(ManifestError, match=r"layer\.weight: sent int64, served float32"):
        check_push_shapes(manifest, model_dir)


def test_floats_of_another_width_pass(model_dir: str) -> None:
    sent = {**SERVED, "layer.weight": SERVED["layer.weight"].to(torch.bfloat16)}
    check_push_shapes(plan_manifest(sent, version=1, bucket_bytes=1 << 20), model_dir)
