"""Rotary position embedding for the lean forward (and the batch-invariant training forward
that shares its layers): the rotary module's cos and signed sin looked up from a table, or
computed every forward, and applied with rotate-half's sign folded into the sin.

Shape legend: B = batch, S = positions, D = head dim, N/C = the caller's leading dims.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

_MIN_ROTARY_POSITIONS = 1024


class _RotaryTable:
    """The rotary module's cos and signed sin (`_signed_sin`) for positions 0..P-1, computed by the
    module itself in one call and then looked up: the per-forward rotary computation (~10 small
    ops) becomes two lookups. Each position's values are the module's own elementwise results;
    the table grows (doubling) when a later position shows up and is rebuilt when the frequency
    buffer, dtype or device changes. Only for rope types whose frequencies are fixed."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self._key: tuple[Any, ...] = ()
        self._cos_PD = self._signed_sin_PD = torch.empty(0, 0)

    def __call__(
        self, like: torch.Tensor, positions_BS: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin [B, S, D] of `positions_BS`, in `like`'s dtype."""
        inv_freq = self.module._buffers["inv_freq"]
        key = (inv_freq.data_ptr(), like.dtype, like.device)
        needed = int(positions_BS.max()) + 1
        if key != self._key or needed > len(self._cos_PD):
            size = max(needed, 2 * len(self._cos_PD), _MIN_ROTARY_POSITIONS)
            positions_P1 = torch.arange(size, device=like.device)[:, None]
            cos_P1D, sin_P1D = self.module(like, positions_P1)
            self._cos_PD, self._signed_sin_PD = cos_P1D[:, 0], _signed_sin(sin_P1D[:, 0])
            self._key = key
        return F.embedding(positions_BS, self._cos_PD), F.embedding(
            positions_BS, self._signed_sin_PD
        )


def _signed_rotary(module: Any) -> Any:
    """The rotary module called every forward, its sin signed (`_signed_sin`)."""

    def rotary(like: torch.Tensor, positions_BS: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos_BSD, sin_BSD = module(like, positions_BS)
        return cos_BSD, _signed_sin(sin_BSD)

    return rotary


def _signed_sin(sin_BSD: torch.Tensor) -> torch.Tensor:
    """sin with its first half negated: rotate-half's sign, folded in once per forward."""
    half = sin_BSD.shape[-1] // 2
    return torch.cat((-sin_BSD[..., :half], sin_BSD[..., half:]), dim=-1)


def _rotate(
    x_NCD: torch.Tensor, cos_N1D: torch.Tensor, signed_sin_N1D: torch.Tensor
) -> torch.Tensor:
    """Rotary embedding: x * cos + rotate_half(x) * sin, with rotate_half's sign in the sin."""
    half = x_NCD.shape[-1] // 2
    swapped = torch.cat((x_NCD[..., half:], x_NCD[..., :half]), dim=-1)
    return x_NCD * cos_N1D + swapped * signed_sin_N1D
