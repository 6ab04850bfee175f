"""Copying a state dict into a live model in place, checked before anything is written, and
laying parameters out back to back so a weight push can land in them without a copy.

Names, shapes and values are validated up front, so a bad update leaves the model untouched:
a tensor holding a nan or an inf is refused (`check_finite`, `NonFiniteWeightsError`, the one
check every path that loads weights into a serving engine runs), as is a policy version that is
not an int >= 0 (`check_policy_version`), and a tensor of another dtype kind than its parameter
(`check_dtype_kind`: an int64 or bool tensor into float weights). Tensors are cast to each
parameter's dtype (floating into floating of any width) and device. It does not handle sharded
(FSDP/DTensor) state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ludic.distributed.checksum import nonfinite


class NonFiniteWeightsError(ValueError):
    """A weight update holding a nan or an inf (`names`: the tensors), refused before loading
    (by a server) or before sending (by a publisher, whose `message` says so)."""

    def __init__(self, names: Sequence[str], message: str | None = None) -> None:
        self.names = list(names)
        shown = ", ".join(self.names[:5]) + (" ..." if len(self.names) > 5 else "")
        super().__init__(
            message
            or f"update_weights: refused: {len(self.names)} tensor(s) hold nan or inf ({shown}); "
            "the served weights were left as they were. The trainer's weights diverged: fix "
            "the training step (learning rate, loss scale) or publish from a finite checkpoint"
        )


def check_finite(state: Mapping[str, torch.Tensor]) -> None:
    """Raise `NonFiniteWeightsError` naming every floating tensor of `state` that holds a nan
    or an inf. Cheap: one float sum per tensor and one device sync per device
    (`ludic.distributed.checksum.nonfinite`); only suspects are read element by element."""
    bad = nonfinite(state)
    if bad:
        raise NonFiniteWeightsError(bad)


def check_policy_version(version: object) -> None:
    """Raise ValueError unless `version` is None (the old one plus one) or an int >= 0."""
    if version is None:
        return
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(
            f"update_weights: version must be an int >= 0 (or left out: the old one plus one), "
            f"got {version!r}"
        )
    if version >= 2**63:
        raise ValueError(
            f"update_weights: version must be below 2**63 (samples carry it as an int64), "
            f"got {version!r}"
        )


def check_dtype_kind(name: str, sent: torch.dtype, held: torch.dtype) -> None:
    """Raise ValueError unless a `sent` tensor may be cast into `held`: floating into floating
    (any width: a bf16 trainer's weights into an fp32 server, as `wire_dtype` sends, or the
    reverse), and a non-floating dtype into a non-floating one. An int or bool tensor cast
    into float weights (or floats truncated into an int buffer) is a wrong state dict."""
    if sent.is_floating_point != held.is_floating_point or sent.is_complex != held.is_complex:
        raise ValueError(
            f"update_weights: {name} is {str(sent).removeprefix('torch.')}, the model holds "
            f"it as {str(held).removeprefix('torch.')}; a tensor is cast only within its kind "
            "(floating into floating): send the model's own state dict"
        )


def _lora_wrapped_hint(targets: Mapping[str, torch.Tensor]) -> str:
    """Why the names differ when the served model is itself LoRA-wrapped (peft): publishers send
    the merged weights under the base model's names, which such a model does not hold."""
    if not any(".lora_A." in name or name.startswith("base_model.model.") for name in targets):
        return ""
    return (
        ". The served model is LoRA-wrapped (peft), and publishers send the merged weights "
        "under the base model's names: serve the base model (build the engine from the model "
        "before add_lora, or from load_model's copy)"
    )


@torch.no_grad()
def copy_weights_(
    model: torch.nn.Module, state: Mapping[str, torch.Tensor], *, strict: bool = True
) -> None:
    """Copy `state` into `model`'s parameters and buffers.

    `strict` also requires every parameter of the model to be present (a full update); with
    `strict=False` a partial update (e.g. one broadcast bucket) is fine. Unknown names and shape
    mismatches always raise ValueError, and a tensor holding a nan or an inf
    `NonFiniteWeightsError` (a ValueError), before any tensor is written.
    """
    targets = model.state_dict()
    unknown = sorted(set(state) - set(targets))
    if unknown:
        raise ValueError(
            f"update_weights: {len(unknown)} unknown tensor names, e.g. {unknown[:3]}; the "
            "state dict must come from the same architecture as the served model"
            + _lora_wrapped_hint(targets)
        )
    if strict:
        missing = sorted(set(dict(model.named_parameters())) - set(state))
        if missing:
            raise ValueError(
                f"update_weights: {len(missing)} parameters missing, e.g. {missing[:3]}; pass "
                "the full state dict or strict=False for a partial update"
            )
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(targets[name].shape):
            raise ValueError(
                f"update_weights: {name} has shape {tuple(tensor.shape)}, the model expects "
                f"{tuple(targets[name].shape)}"
            )
        check_dtype_kind(name, tensor.dtype, targets[name].dtype)
    check_finite(state)
    for name, tensor in state.items():
        target = targets[name]
        target.copy_(tensor.to(device=target.device, dtype=target.dtype))


@torch.no_grad()
def pack_parameters_(model: torch.nn.Module, groups: Sequence[Sequence[str]]) -> int:
    """Move each group of parameters (by name, in order) into one fresh contiguous buffer, as
    views of it, so the group can be received as one flat tensor. Values are kept.

    A group naming anything but distinct, contiguous parameters of one dtype and device (a
    buffer, a tied alias, a repeated name) is left as it is. Returns how many groups moved.
    Call it between forward passes: it swaps each parameter's storage.
    """
    params = dict(model.named_parameters())
    moved = 0
    for names in groups:
        if len(names) < 2 or not all(name in params for name in names):
            continue
        group = [params[name] for name in names]
        first = group[0]
        if len({id(p) for p in group}) != len(group) or not all(
            p.is_contiguous() and p.dtype == first.dtype and p.device == first.device for p in group
        ):
            continue
        flat = torch.empty(sum(p.numel() for p in group), dtype=first.dtype, device=first.device)
        offset = 0
        for p in group:
            view = flat[offset : offset + p.numel()].view_as(p)
            view.copy_(p)
            p.data = view
            offset += p.numel()
        moved += 1
    return moved
