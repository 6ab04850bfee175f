"""copy_weights_ and pack_parameters_: updates checked before any write; parameters laid out
back to back keep their values and their module's outputs."""

from __future__ import annotations

import pytest
import torch

from ludic.distributed.transfer import adjacent_view
from ludic.inference.weights import copy_weights_, pack_parameters_


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 2))
    model.register_buffer("scale", torch.ones(2))
    return model


def test_pack_parameters_lays_groups_back_to_back_keeping_values_and_outputs() -> None:
    model = _model()
    x = torch.randn(5, 4)
    before = model(x)
    values = {k: v.clone() for k, v in model.state_dict().items()}
    names = [["0.weight", "0.bias", "1.weight", "1.bias"], ["2.weight", "2.bias"]]
    assert pack_parameters_(model, names) == 2
    params = dict(model.named_parameters())
    for group in names:
        assert adjacent_view([params[n] for n in group]) is not None
    assert all(torch.equal(model.state_dict()[k], v) for k, v in values.items())
    assert torch.equal(model(x), before)
    copy_weights_(model, {"2.bias": torch.tensor([5.0, 6.0])}, strict=False)  # still live
    assert torch.equal(model[2].bias, torch.tensor([5.0, 6.0]))


def test_pack_parameters_leaves_groups_it_cannot_lay_out() -> None:
    model = _model()
    skipped = [
        ["0.weight", "scale"],  # a buffer
        ["0.weight", "0.weight"],  # a repeated name
        ["0.weight", "nope"],  # unknown
        ["0.weight"],  # nothing to gain
    ]
    pointers = {n: p.data_ptr() for n, p in model.named_parameters()}
    assert pack_parameters_(model, skipped) == 0
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == pointers


def test_copy_weights_refuses_bad_updates_before_writing() -> None:
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="unknown tensor names"):
        copy_weights_(model, {"0.weight": torch.zeros(3, 4), "zzz": torch.zeros(1)})
    with pytest.raises(ValueError, match="has shape"):
        copy_weights_(model, {"0.bias": torch.zeros(3), "2.bias": torch.zeros(7)}, strict=False)
    with pytest.raises(ValueError, match="parameters missing"):
        copy_weights_(model, {"0.bias": torch.zeros(3)})
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
