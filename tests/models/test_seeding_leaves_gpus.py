"""Building a tiny model or drawing LoRA adapters from a seed reseeds no GPU's RNG.

Both fork torch's RNGs around the seeded draw. `torch.manual_seed` inside the fork would also
reseed every GPU's generator (lazily, on a box where CUDA is not up yet), which the fork does not
restore: a run on a GPU box that seeded CUDA before building its model would get another stream.
Checked here without a GPU by recording the calls that reseed the GPUs.
"""

from __future__ import annotations

import pytest
import torch

from ludic.models import TinyModelSpec, build_tiny_model
from ludic.training import add_lora

SPEC = TinyModelSpec(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    tokenizer_vocab_size=300,
)


def tiny(seed: int = 5) -> torch.nn.Module:
    return build_tiny_model(seed, SPEC)[0]


@pytest.fixture
def gpu_reseeds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", calls.append)
    monkeypatch.setattr(torch.cuda, "manual_seed", calls.append)
    return calls


def test_a_tiny_model_build_reseeds_no_gpu(gpu_reseeds: list[int]) -> None:
    before = torch.get_rng_state()
    tiny()
    assert gpu_reseeds == []
    assert torch.equal(torch.get_rng_state(), before)


def test_lora_adapters_drawn_from_a_seed_reseed_no_gpu(gpu_reseeds: list[int]) -> None:
    pytest.importorskip("peft")
    model = tiny()
    before = torch.get_rng_state()
    first = add_lora(model, rank=2, alpha=4, seed=7)
    assert gpu_reseeds == []
    assert torch.equal(torch.get_rng_state(), before)
    again = add_lora(tiny(), rank=2, alpha=4, seed=7)
    drawn = {n: p for n, p in first.named_parameters() if "lora_A" in n}
    assert drawn and all(
        torch.equal(p, dict(again.named_parameters())[n]) for n, p in drawn.items()
    )
