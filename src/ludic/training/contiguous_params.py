"""Laying a trainer's parameters out back to back, one storage per dtype and device, so that a
weight push sends them as a few spans (`ludic.distributed.manifest`: fewer, larger broadcasts
and no packing copy) instead of one bucket per large tensor and a copy of the small ones.

`make_contiguous_(model)` moves every parameter into one fresh buffer per (dtype, device) as a
view of it (`p.data = view`): the same Parameter objects with the same values and shapes, so an
optimizer built before or after holds the same parameters and a step computes the same numbers.
The order is the state dict's, with each layer's q/k/v and gate/up weights (and their biases)
pulled together (`fused_groups`), the order in which the publisher plans its buckets and a server
fuses its GEMMs. A parameter tied under two names (one Parameter) moves once and stays tied;
distinct parameters that already share memory (aliases) are left where they are.

It does not apply to sharded parameters (FSDP2 keeps its own flat buffers, and publishing
gathers new tensors) nor to LoRA models (the published weights are merged copies, not the
parameters): `contiguous_problem(model)` says why. The move holds a second copy of one dtype's
parameters for a moment; when that allocation fails, the parameters stay where they were (with
a warning). Gradients and optimizer states are not laid out.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable

import torch

from ludic.distributed.manifest import fused_groups

logger = logging.getLogger(__name__)

__all__ = ["contiguous_problem", "make_contiguous_", "parameter_order"]


def contiguous_problem(model: torch.nn.Module) -> str | None:
    """Why `model`'s parameters cannot be laid out back to back usefully, or None."""
    from torch.distributed.tensor import DTensor

    from ludic.training.lora import is_lora_model

    if is_lora_model(model):
        return (
            "a LoRA model publishes merged copies of its weights, not its parameters, so their "
            "layout does not reach the wire"
        )
    params = list(model.parameters())
    if any(isinstance(p, DTensor) for p in params):
        return "the model is sharded (FSDP2 keeps its own flat buffers; publishing gathers copies)"
    if any(p.device.type == "meta" for p in params):
        return "some parameters are on the meta device (not materialised yet)"
    return None


def parameter_order(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """`model`'s parameters (each once, under its first name) in state-dict order with every
    fused group (`fused_groups`: q/k/v, gate/up, weights and biases apart) consecutive."""
    named = dict(model.named_parameters())
    names = list(named)
    owner: dict[str, list[str]] = {}
    for group in fused_groups(names):
        owner.update({name: group for name in group})
    ordered: list[str] = []
    seen: set[str] = set()
    for name in names:
        if name not in seen:
            unit = owner.get(name, [name])
            ordered += unit
            seen.update(unit)
    return [(name, named[name]) for name in ordered]


@torch.no_grad()
def make_contiguous_(model: torch.nn.Module) -> int:
    """Move `model`'s parameters into one buffer per (dtype, device), back to back in
    `parameter_order`; values, shapes and Parameter objects are kept. Returns the bytes moved
    (0 when nothing moved). Raises ValueError for a model `contiguous_problem` refuses."""
    problem = contiguous_problem(model)
    if problem is not None:
        raise ValueError(f"cannot lay the parameters out back to back: {problem}")
    order = parameter_order(model)
    shared = _aliased(p for _, p in order)
    groups: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = defaultdict(list)
    for _, p in order:
        if id(p) not in shared and p.numel() > 0:
            groups[(p.dtype, p.device)].append(p)
    moved = 0
    for (dtype, device), params in groups.items():
        if _already_flat(params):
            continue
        numel = sum(p.numel() for p in params)
        try:
            flat = torch.empty(numel, dtype=dtype, device=device)
        except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
            logger.warning(
                "contiguous parameters: no room for a second copy of the %s parameters on %s "
                "(%s); they stay where they are (each tensor then travels on its own)",
                dtype,
                device,
                e,
            )
            continue
        offset = 0
        for p in params:
            view = flat[offset : offset + p.numel()].view(p.shape)
            view.copy_(p)
            p.data = view
            offset += p.numel()
        moved += numel * flat.element_size()
    return moved


def _aliased(params: Iterable[torch.nn.Parameter]) -> set[int]:
    """ids of distinct parameters whose memory overlaps another's (left where they are)."""
    spans = sorted(
        (p.data_ptr(), p.data_ptr() + p.numel() * p.element_size(), id(p))
        for p in params
        if p.numel() > 0
    )
    overlapping: set[int] = set()
    reach, reach_id = -1, 0
    for start, end, ident in spans:
        if start < reach:
            overlapping.update((ident, reach_id))
        if end > reach:
            reach, reach_id = end, ident
    return overlapping


def _already_flat(params: list[torch.nn.Parameter]) -> bool:
    """Whether `params` already fill one storage back to back in this order."""
    storage = params[0].untyped_storage()
    if params[0].storage_offset() != 0 or any(not p.is_contiguous() for p in params):
        return False
    end = params[0].data_ptr()
    for p in params:
        if p.untyped_storage().data_ptr() != storage.data_ptr() or p.data_ptr() != end:
            return False
        end += p.numel() * p.element_size()
    return end - storage.data_ptr() == storage.nbytes()
