"""A model's state dict, walked once and reused while the model keeps the same tensors.

`Module.state_dict()` walks the whole module tree (hooks, prefixes, one call per module): on the
tiny model that is ~0.3 ms, a twentieth of a weight push, paid on both sides of every push.
`LiveStateDict(model)()` returns the same mapping (detached tensors that share the parameters'
memory) from a cached walk. The cache is dropped, and the tree walked again, when anything may
have changed which tensors the state dict holds:

- a parameter, buffer or submodule was registered anywhere in the process (torch's global
  registration hooks count them), e.g. `model.lm_head = nn.Linear(...)`;
- an entry is no longer the one its module holds (deleted, or swapped in `_parameters`
  directly, as FSDP2 does when it shards).

A parameter's storage may change freely (`p.data = ...`, `load_state_dict`, `model.to(...)`):
tensors are detached on every call, so they always see the current storage. A model whose
state dict holds anything but its own registered parameters and buffers (a module computing
entries in a state-dict hook) is never cached: each call walks it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules import module as _module

_registrations = 0  # parameters, buffers and modules registered in this process so far


def _count_registration(*_args: Any) -> None:
    global _registrations
    _registrations += 1


_module.register_module_parameter_registration_hook(_count_registration)
_module.register_module_buffer_registration_hook(_count_registration)
_module.register_module_module_registration_hook(_count_registration)


# A state-dict entry: its name, the dict holding it (a module's `_parameters` or `_buffers`),
# its key there, and the tensor.
_Entry = tuple[str, dict[str, Any], str, torch.Tensor]


class LiveStateDict:
    """`model.state_dict()`, from a cached walk while the model's tensors are the same."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._entries: list[_Entry] | None = None  # None: cannot be cached
        self._seen = -1  # `_registrations` when the tree was last walked
        self.walks = 0

    def __call__(self) -> dict[str, torch.Tensor]:
        if self._entries is None or not self._valid():
            return self._walk()
        return {name: tensor.detach() for name, _, _, tensor in self._entries}

    def _valid(self) -> bool:
        assert self._entries is not None
        if self._seen != _registrations:
            return False
        return all(holder.get(key) is tensor for _, holder, key, tensor in self._entries)

    def _walk(self) -> dict[str, torch.Tensor]:
        self.walks += 1
        self._seen = _registrations
        state = self.model.state_dict(keep_vars=True)
        self._entries = self._entries_of(state)
        return {name: tensor.detach() for name, tensor in state.items()}

    def _entries_of(self, state: dict[str, torch.Tensor]) -> list[_Entry] | None:
        """Where each entry is registered; None if one is not a registered tensor."""
        entries: list[_Entry] = []
        for name, tensor in state.items():
            path, _, key = name.rpartition(".")
            try:
                owner = self.model.get_submodule(path)
            except AttributeError:
                return None
            holder: dict[str, Any] = (
                owner._parameters if key in owner._parameters else owner._buffers
            )
            if holder.get(key) is not tensor:  # made by a hook
                return None
            entries.append((name, holder, key, tensor))
        return entries
