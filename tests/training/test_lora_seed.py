"""`add_lora` draws its A matrices from its `seed`, whatever torch's RNG holds (torch seeds it at
random in each process), and leaves that RNG as it was."""

from __future__ import annotations

import copy

import pytest
import torch

from ludic.models import load_tiny_model
from ludic.training import add_lora

pytest.importorskip("peft")


def _adapters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_the_same_seed_draws_the_same_adapters_and_leaves_torchs_rng_alone() -> None:
    base, _ = load_tiny_model()
    torch.manual_seed(1)
    first = _adapters(add_lora(copy.deepcopy(base)))
    torch.manual_seed(2)  # another process's random start
    state = torch.get_rng_state()
    second = _adapters(add_lora(copy.deepcopy(base)))
    assert torch.equal(torch.get_rng_state(), state)
    other = _adapters(add_lora(copy.deepcopy(base), seed=1))
    assert first.keys() == second.keys() and any("lora_A" in n for n in first)
    assert all(torch.equal(first[n], second[n]) for n in first)
    assert any(not torch.equal(first[n], other[n]) for n in first if "lora_A" in n)


def test_only_the_models_own_devices_rngs_are_forked(monkeypatch: pytest.MonkeyPatch) -> None:
    """`fork_rng()` without devices reads every visible GPU's RNG (a CUDA context on each, in
    every torchrun rank); a CPU model forks none. CUDA here 'reports' 4 devices."""
    touched: list[object] = []

    def get_rng_state(device: object = "cuda") -> torch.Tensor:
        touched.append(device)
        return torch.zeros(1, dtype=torch.uint8)

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", get_rng_state)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": None)
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: None)
    base, _ = load_tiny_model()
    add_lora(base)
    assert touched == []
