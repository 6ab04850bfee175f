"""A one-process run asked for CUDA where there is none is refused when its runtime is made,
naming the device and the fix, as the FSDP2 runtime refuses it on each rank: before, the
Trainer got torch's `AssertionError: Torch not compiled with CUDA enabled` from `model.to`."""

from __future__ import annotations

import pytest
import torch

from ludic.training import Trainer, TrainerConfig, make_grpo
from ludic.training.parallel import LocalRuntime


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_refused_naming_the_device_and_the_fix() -> None:
    with pytest.raises(RuntimeError, match=r"device='cuda:0' but CUDA is not available.*'cpu'"):
        LocalRuntime("cuda:0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_a_trainer_on_cuda_without_cuda_is_refused_before_the_model_moves() -> None:
    model = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match=r"device='cuda' but CUDA is not available"):
        Trainer(model, make_grpo(), object(), TrainerConfig(device="cuda"))  # type: ignore[arg-type]
    assert model.weight.device.type == "cpu"


def test_cpu_needs_no_cuda() -> None:
    assert LocalRuntime("cpu").device == torch.device("cpu")
