"""LiveStateDict: the same mapping as `model.state_dict()`, walked again exactly when the set
of tensors changed."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from ludic.distributed.live_state import LiveStateDict


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied: both names, one tensor
        self.register_buffer("scale", torch.ones(4))
        self.register_buffer("scratch", torch.zeros(4), persistent=False)


def assert_same_as_state_dict(live: LiveStateDict, model: nn.Module) -> None:
    got, want = live(), model.state_dict()
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert got[name].data_ptr() == tensor.data_ptr() and got[name].shape == tensor.shape
        assert not got[name].requires_grad


def test_matches_state_dict_and_walks_once() -> None:
    model = Tiny()
    live = LiveStateDict(model)
    for _ in range(3):
        assert_same_as_state_dict(live, model)
    assert live.walks == 1
    assert "scratch" not in live() and "head.weight" in live()


def test_new_storage_is_seen_without_a_walk() -> None:
    model = Tiny()
    live = LiveStateDict(model)
    live()
    with torch.no_grad():
        model.body[0].weight.data = torch.full((4, 4), 3.0)  # as pack_parameters_ does
        model.load_state_dict({k: v + 1 for k, v in model.state_dict().items()})
    assert_same_as_state_dict(live, model)
    assert torch.equal(live()["body.0.weight"], torch.full((4, 4), 4.0))
    assert live.walks == 1


def test_registering_anything_walks_again() -> None:
    model = Tiny()
    live = LiveStateDict(model)
    live()
    model.body[0] = nn.Linear(4, 4)  # a replaced submodule
    assert_same_as_state_dict(live, model)
    assert live.walks == 2
    model.head.bias = nn.Parameter(torch.zeros(10))  # a new parameter
    assert_same_as_state_dict(live, model)
    model.register_buffer("offset", torch.zeros(2))
    assert_same_as_state_dict(live, model)
    assert live.walks == 4


def test_entries_swapped_or_deleted_behind_the_hooks_walk_again() -> None:
    model = Tiny()
    live = LiveStateDict(model)
    live()
    model.body[1]._parameters["weight"] = nn.Parameter(torch.full((4,), 2.0))  # as FSDP2 does
    assert torch.equal(live()["body.1.weight"], torch.full((4,), 2.0))
    del model.body[1].bias
    assert "body.1.bias" not in live()
    assert live.walks == 3


class Computed(nn.Module):
    """A state-dict hook adds an entry that is no registered tensor: never cached."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.calls = 0
        self._register_state_dict_hook(self._add_scaled)

    def _add_scaled(self, module: nn.Module, state: OrderedDict[str, Any], prefix: str, _: Any):
        self.calls += 1
        state[prefix + "doubled"] = module.linear.weight * 2


def test_state_made_by_hooks_is_walked_every_time() -> None:
    model = Computed()
    live = LiveStateDict(model)
    first = live()["doubled"]
    with torch.no_grad():
        model.linear.weight.add_(1.0)
    assert torch.equal(live()["doubled"], first + 2)
    assert live.walks == 2 and model.calls == 2
