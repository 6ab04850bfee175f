"""A checkpoint holds one CUDA RNG state per GPU the saving process saw; resuming where fewer
are visible (8 under torchrun, then a 1-GPU box) restores the states of the GPUs there are
(`torch.cuda.set_rng_state_all` raised "invalid device ordinal" for the others). Faked CUDA:
CI has no GPU."""

from __future__ import annotations

import pytest
import torch

from ludic.training.checkpoint_contents import capture_rng_state, restore_rng_state


@pytest.mark.parametrize("visible", [1, 2, 8])
def test_rng_states_of_eight_gpus_restore_on_the_gpus_there_are(
    visible: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    restored: dict[int, torch.Tensor] = {}

    def set_rng_state(state: torch.Tensor, device: int) -> None:
        if device >= visible:
            raise RuntimeError("CUDA error: invalid device ordinal")
        restored[device] = state

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    saved = [torch.full((16,), i, dtype=torch.uint8) for i in range(8)]
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: saved)
    json_state, tensors = capture_rng_state()
    assert len(tensors["cuda"]) == 8

    restore_rng_state(json_state, tensors)
    assert sorted(restored) == list(range(visible))
    for index, state in restored.items():
        assert torch.equal(state, saved[index])
