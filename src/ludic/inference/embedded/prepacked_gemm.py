"""oneDNN-prepacked GEMM weights for the lean forward (`LeanForward(prepacked=True)`,
`EngineConfig(prepacked_gemm=True)`).

Each GEMM runs through oneDNN on a copy of its weight packed once in oneDNN's blocked layout
(`Packs`): 1.1x (3M) to 1.6x (49M) faster decode on the AMD CPUs here, at the cost of a second
copy of the weights and of today's rounding (logits move by float noise, ~1e-5 to 1e-4 in
float32, so it is off by default). A pack is rebuilt when its weight's address, shape or version
counter changes (in-place updates, optimizer steps) and all are dropped by `Packs.clear()`, which
the lean forward's `weights_changed()` calls (a broadcast writing straight into the parameters
bumps no version counter). Float32 on CPU only; it does not decide which GEMMs are fused (the
lean forward does).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

__all__ = ["Packs", "pack_for", "packed_linear", "unpackable"]


class Packs:
    """oneDNN-packed copies of GEMM weights, by the weight's address and shape. A pack is
    rebuilt when the address, version counter or shape of any parameter it was built from
    changed (a fused weight is built from several), so in-place updates never meet a stale
    pack; `clear()` drops them all (for writes that bump no version counter)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # more weights than the forward has: some moved, their packs are garbage
        self._entries: dict[tuple[Any, ...], tuple[tuple[Any, ...], torch.Tensor]] = {}

    def get(self, weight: torch.Tensor, sources: list[torch.Tensor]) -> torch.Tensor:
        key = (weight.data_ptr(), weight.shape, weight.stride())
        stamp = tuple((p.data_ptr(), p._version, p.shape) for p in sources)
        entry = self._entries.get(key)
        if entry is None or entry[0] != stamp:
            if entry is None and len(self._entries) >= self.limit:
                self._entries.clear()
            entry = (stamp, torch.ops.mkldnn._reorder_linear_weight(weight.detach()))
            self._entries[key] = entry
        return entry[1]

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def pack_for(
    packs: Packs | None, weight: torch.Tensor, sources: list[torch.Tensor]
) -> torch.Tensor | None:
    """`weight`'s pack (built from `sources`), or None without `packs` (plain GEMMs)."""
    return None if packs is None else packs.get(weight, sources)


def packed_linear(
    x_NE: torch.Tensor, pack: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x @ weight.T (+ bias) through oneDNN on `pack` (`weight` packed by `Packs`)."""
    y_NO = torch.ops.mkldnn._linear_pointwise(
        x_NE.reshape(-1, x_NE.shape[-1]), pack, bias, "none", [], ""
    )
    return y_NO.view(*x_NE.shape[:-1], y_NO.shape[-1])


def unpackable(model: PreTrainedModel, batch_invariant: bool) -> str | None:
    """Why oneDNN-packed GEMMs (`prepacked`) cannot serve `model` here, or None."""
    if batch_invariant:
        return (
            "prepacked GEMMs round differently from the batch-invariant ones: use one or the other"
        )
    if model.dtype != torch.float32 or model.device.type != "cpu":
        return f"prepacked GEMMs need a float32 model on CPU (this one: {model.dtype} on {model.device})"
    if not torch.backends.mkldnn.is_available():
        return "prepacked GEMMs need a torch build with oneDNN (torch.backends.mkldnn)"
    return None
