"""Full (unsharded) training states, independent of how many processes hold the model: fitting
a stored model state to a live model (tied weights, LoRA adapter keys) and converting optimizer
states between the single-process layout (params by index) and DCP's (params by name).

Pure functions on dicts; no collectives, no file I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ludic.training.lora import adapter_keys_to_model, is_lora_model


def fit_state_to_model(
    model: torch.nn.Module, state: Mapping[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], bool]:
    """A new dict holding `state` under `model`'s names, and whether it is partial.

    A missing tied weight (HF omits `lm_head.weight` when tied) is filled from its twin. A LoRA
    model takes adapter-only states (peft's key names are mapped to the live ones) and is loaded
    partially; its trainable weights must all be present. Raises ValueError naming the first
    keys that do not fit, and how many (only those: `check_checkpoint_fits` puts it after
    "CHECKPOINT does not fit the model: ").
    """
    lora = is_lora_model(model)
    fitted = adapter_keys_to_model(state) if lora else dict(state)
    expected = set(model.state_dict().keys())
    unexpected = sorted(set(fitted) - expected)
    if unexpected:
        raise ValueError(
            f"unexpected keys {unexpected[:5]} ({len(unexpected)} in the weights but not in the "
            "model)"
        )
    _fill_tied(model, fitted)
    missing = expected - set(fitted)
    if lora:
        missing &= {n for n, p in model.named_parameters() if p.requires_grad}
    if missing:
        raise ValueError(
            f"missing keys {sorted(missing)[:5]} ({len(missing)} in the model but not in the "
            "weights)"
        )
    return fitted, lora


def _fill_tied(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    for names in groups.values():
        present = [n for n in names if n in state]
        for name in names:
            if name not in state and present:
                state[name] = state[present[0]]


def optimizer_param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of each parameter the optimizer holds, in its state-dict index order."""
    names = {id(p): n for n, p in model.named_parameters()}
    order = [p for group in optimizer.param_groups for p in group["params"]]
    unknown = [i for i, p in enumerate(order) if id(p) not in names]
    if unknown:
        raise ValueError(
            f"optimizer parameters {unknown[:5]} are not the model's: build the optimizer from "
            "the model the runtime prepared (Trainer does this when optimizer=None)"
        )
    return [names[id(p)] for p in order]


def indexed_optimizer_state(named: Mapping[str, Any]) -> dict[str, Any]:
    """DCP's full optimizer state (params by name) in the `optimizer.state_dict()` layout."""
    groups = named["param_groups"]
    index = {name: i for i, name in enumerate(n for g in groups for n in g["params"])}
    return {
        "state": {index[name]: value for name, value in named["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in groups],
    }


def named_optimizer_state(indexed: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    """An `optimizer.state_dict()` layout state with params by name, `names` in index order."""
    groups = indexed["param_groups"]
    count = sum(len(g["params"]) for g in groups)
    if count != len(names):
        raise ValueError(
            f"the optimizer state holds {count} parameters but the optimizer has {len(names)}: "
            "it was saved for another model or another set of trainable parameters"
        )
    return {
        "state": {names[int(i)]: value for i, value in indexed["state"].items()},
        "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in groups],
    }
