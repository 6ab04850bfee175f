"""The pieces FSDP training relies on, checked in one process: lockstep padding passes add
exactly zero gradient, optimizer states convert between index and name layouts losslessly,
stored states are fitted to the live model with clear errors, and rank-0 failures propagate."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from training_fakes import ListSource, WeightedNLL, mixed_items, tiny_llama
from transformers import LlamaConfig, LlamaForCausalLM

from ludic.training import (
    BatchTotals,
    ConstantCredit,
    LocalRuntime,
    RLAlgorithm,
    Trainer,
    accumulate_gradients,
    auto_runtime,
    collate,
)
from ludic.training.parallel import (
    fit_state_to_model,
    indexed_optimizer_state,
    named_optimizer_state,
    optimizer_param_names,
    run_on_main,
)

ALGORITHM = RLAlgorithm(name="test", credit_assigner=ConstantCredit(value=1.0), loss=WeightedNLL())


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]


def test_padding_passes_add_exactly_zero_gradient() -> None:
    batch = collate(mixed_items(4))
    plain, padded = tiny_llama(), tiny_llama()
    a = accumulate_gradients(plain, WeightedNLL(), batch, [[0, 1], [2, 3]])
    b = accumulate_gradients(padded, WeightedNLL(), batch, [[0, 1], [2, 3]], num_passes=4)
    assert b.num_micro_batches == 4 and b.loss == a.loss and b.finite
    for x, y in zip(_grads(plain), _grads(padded), strict=True):
        assert torch.equal(x, y)


def test_rank_without_samples_runs_zero_gradient_passes() -> None:
    model = tiny_llama()
    totals = BatchTotals(action_tokens=10.0, sequences=2.0)  # the other ranks' samples
    result = accumulate_gradients(model, WeightedNLL(), None, [], totals=totals, num_passes=2)
    assert result.loss == 0.0 and result.finite and result.num_micro_batches == 2
    assert all(torch.count_nonzero(g) == 0 for g in _grads(model))  # touched, all zero
    with pytest.raises(ValueError, match="explicit totals"):
        accumulate_gradients(model, WeightedNLL(), None, [], num_passes=1)


def test_totals_normalise_a_share_of_a_bigger_batch() -> None:
    # Two halves normalised by the whole batch's totals add up to the whole batch's gradient.
    items = mixed_items(4)
    whole, halves = tiny_llama(), tiny_llama()
    full = collate(items)
    accumulate_gradients(whole, WeightedNLL(), full, [[0, 1, 2, 3]])
    totals = BatchTotals.of(full)
    for share in (items[:2], items[2:]):
        accumulate_gradients(halves, WeightedNLL(), collate(share), [[0, 1]], totals=totals)
    for x, y in zip(_grads(whole), _grads(halves), strict=True):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=0)


def test_lockstep_nonfinite_loss_runs_every_pass_without_gradient() -> None:
    model = tiny_llama()
    batch = collate(mixed_items(4))
    poison = WeightedNLL(poison=True)
    result = accumulate_gradients(model, poison, batch, [[0, 1], [2, 3]], num_passes=3)
    assert not result.finite and result.num_micro_batches == 3
    assert all(torch.count_nonzero(g) == 0 for g in _grads(model))


def _stepped(model: torch.nn.Module) -> torch.optim.AdamW:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    return optimizer


def test_optimizer_state_converts_between_index_and_name_layouts() -> None:
    model = tiny_llama()
    optimizer = _stepped(model)
    names = optimizer_param_names(model, optimizer)
    assert names == [n for n, _ in model.named_parameters()]
    indexed = optimizer.state_dict()
    named = named_optimizer_state(indexed, names)
    assert set(named["state"]) <= set(names)
    assert indexed_optimizer_state(named) == indexed
    count = len(names)
    with pytest.raises(
        ValueError, match=f"holds {count} parameters but the optimizer has {count - 1}"
    ):
        named_optimizer_state(indexed, names[:-1])
    with pytest.raises(ValueError, match="not the model's"):
        optimizer_param_names(tiny_llama(), optimizer)


def test_fit_state_fills_tied_weights_and_names_bad_keys() -> None:
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    fitted, partial = fit_state_to_model(model, state)
    assert not partial and fitted["lm_head.weight"] is state["model.embed_tokens.weight"]
    assert "lm_head.weight" not in state  # the caller's dict is left alone
    with pytest.raises(ValueError, match=re.escape("unexpected keys ['extra']")):
        fit_state_to_model(model, {**state, "extra": torch.zeros(1)})
    del state["model.norm.weight"]
    with pytest.raises(ValueError, match=re.escape("missing keys ['model.norm.weight']")):
        fit_state_to_model(model, state)


def test_single_process_runtime_is_the_default_and_rank_zero_errors_surface() -> None:
    runtime = auto_runtime("cpu")
    assert isinstance(runtime, LocalRuntime) and runtime.world_size == 1 and runtime.is_main
    assert run_on_main(runtime, lambda: 41 + 1) == 42

    def fail() -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        run_on_main(runtime, fail)


def test_trainer_refuses_an_optimizer_built_on_another_model(tmp_path: Path) -> None:
    stray = torch.optim.AdamW(tiny_llama().parameters())
    with pytest.raises(ValueError, match="not the model's"):
        Trainer(tiny_llama(), ALGORITHM, ListSource([mixed_items(2)]), optimizer=stray)
